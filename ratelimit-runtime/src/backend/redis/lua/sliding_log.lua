-- sliding_log: an exact sliding window over the calls' times (seed 002, as
-- one atomic script). At most `count` units in any interval of length
-- `period`. Mirrors src/algorithm/sliding_log.rs.
--
-- key  a short log (up to LOG_IN_STRING units in the window, as most keys of
--      a small limit hold): a string "L" .. the units' times (µs), oldest
--      first, packed; read (in a batch, with the batch's MGET) and written
--      whole, one SET.
--      A longer one: a sorted set, one member per unit, scored by its time.
--      A log moves to a sorted set when it outgrows the string, and stays
--      one until its key expires.
--
-- In the sorted set, calls older than the window are never counted (ZCOUNT
-- counts the live ones), so they need not be removed at every call: they
-- are trimmed when a call is refused or its retry time needs the live
-- calls' ranks, and at about one call in eight (the time's last bits),
-- which bounds what the set holds beyond `count`. Either way the key
-- expires `period` after its newest call.
local LOG_IN_STRING = 16

-- `now` packed as a log's time. The checks of a batch share one `now`, so it
-- is packed once for them all (the last one packed is kept, with its time).
local packed_for, packed_now
local function packed_time(now)
    if packed_for ~= now then packed_for, packed_now = now, struct_pack('>d', now) end
    return packed_now
end

-- Where a string log's times still in the window at `now` start (a byte
-- offset into `stored`), and how many there are; nil when `stored` is not a
-- string log. A call at time t counts while now < t + period; the oldest
-- leave first, as the memory backend's log pops its front.
local function string_log(stored, now, period)
    if type(stored) ~= 'string' or string_byte(stored) ~= 76 or (#stored - 1) % 8 ~= 0 then
        return nil
    end
    local at, stop = 2, #stored
    while at < stop and struct_unpack('>d', stored, at) + period <= now do at = at + 8 end
    return at, (stop + 1 - at) / 8
end

-- The `i`th oldest live time of a string log whose `n` live times start at
-- byte `at` of `stored`; past those, the units the call just added, at `now`.
local function log_time(stored, at, n, i, now)
    if i > n then return now end
    return struct_unpack('>d', stored, at + 8 * (i - 1))
end

-- The sorted-set log: `held` live units counted already.
local function sliding_log_set(key, now, slack, count, period, cost, held)
    local allowed = 0
    if held + cost <= count then
        allowed = 1
        -- Members are unique: those already scored `now` are live and have
        -- suffixes below `held`. The time is packed (8 bytes; cheaper than
        -- decimal text).
        add_units(key, cost, now, packed_time(now), held)
        held = held + cost
        redis_call('PEXPIRE', key, text(math.ceil(period / 1000) + slack))
    end
    local remaining = math.max(count - held, 0)
    if allowed == 0 or remaining < cost or now % 8 == 0 then
        redis_call('ZREMRANGEBYSCORE', key, '-inf', text(now - period))
    end
    local reset = 0
    if allowed == 1 then
        reset = period -- the newest call is this one
    elseif held > 0 then
        reset = score_at(key, -1) + period - now
    end
    local retry = 0
    if remaining < cost then
        -- The oldest `held + cost - count` calls must leave the window first.
        retry = score_at(key, held + cost - count - 1) + period - now
    end
    return allowed, remaining, reset, retry
end

local function sliding_log(key, now, slack, count, burst, period, cost)
    -- The stored value as load() takes it (read ahead, or read here), but
    -- whole: a string log's length varies.
    local stored = pending
    if stored == nil then stored = redis_pcall('GET', key) end
    pending = nil
    local at, held = string_log(stored, now, period)
    if not at then
        -- No string log: a sorted set, or nothing (or another algorithm's
        -- state: a fresh start, as the memory backend makes).
        local live = redis_pcall('ZCOUNT', key, above(now - period), '+inf')
        if type(live) == 'number' and live > 0 then
            return sliding_log_set(key, now, slack, count, period, cost, live)
        end
        -- Nothing live: the string log starts (its SET replaces the key).
        stored, at, held = 'L', 2, 0
    end
    local stored_held = held
    local allowed = 0
    if held + cost <= count then
        allowed = 1
        local ttl = text(math.ceil(period / 1000) + slack)
        if held + cost <= LOG_IN_STRING then
            local added = packed_time(now)
            if cost > 1 then added = string.rep(added, cost) end
            redis_call('SET', key, 'L' .. string.sub(stored, at) .. added, 'PX', ttl)
        else
            -- Outgrown: the same units as a sorted set, ranked by position.
            local args = {}
            for i = 1, held + cost do
                local t = log_time(stored, at, stored_held, i, now)
                args[#args + 1] = text(t)
                args[#args + 1] = struct_pack('>d', t) .. ':' .. text(i - 1)
            end
            redis_call('DEL', key)
            for first = 1, #args, 2000 do
                redis_call('ZADD', key, unpack(args, first, math.min(first + 1999, #args)))
            end
            redis_call('PEXPIRE', key, ttl)
        end
        held = held + cost
    end

    local remaining = math.max(count - held, 0)
    local reset = 0
    if allowed == 1 then
        reset = period -- the newest call is this one
    elseif held > 0 then
        reset = log_time(stored, at, stored_held, held, now) + period - now
    end
    local retry = 0
    if remaining < cost then
        -- The oldest `held + cost - count` calls must leave the window first.
        retry = log_time(stored, at, stored_held, held + cost - count, now) + period - now
    end
    return allowed, remaining, reset, retry
end
