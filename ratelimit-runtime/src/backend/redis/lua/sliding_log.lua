-- sliding_log: an exact sliding window over the calls' times (seed 002, as
-- one atomic script). At most `count` units in any interval of length
-- `period`. Mirrors src/algorithm/sliding_log.rs.
--
-- key  a short log (up to LOG_IN_STRING units in the window, as most keys of
--      a small limit hold): a string, header "rl\1L" .. the units' times
--      (µs), oldest first, packed; read (in a batch, with the batch's MGET)
--      and written whole, one SET.
--      A longer one: a sorted set, one member per call whatever its cost,
--      scored by its time: packed (through, units), `through` the units
--      counted through that call since the set began. The units in the
--      window are the newest call's `through` less that of the last call to
--      have left it, so a check costs a few O(log n) lookups, never work in
--      proportion to a cost or a count. The member LOG_SET (score -1) marks
--      the set as ours.
--      A log moves to a sorted set when it outgrows the string, and stays
--      one until nothing in it is live.
--
-- Times never go back in a log (a call is scored no earlier than the
-- newest), so `through` grows with the score, and ties of score order by
-- member as by `through` (big-endian doubles of positive numbers sort as
-- the numbers do).
--
-- Calls older than the window are never counted, so they need not be
-- removed at every call: they are trimmed (up to TRIM at once; the last to
-- have left is kept, its `through` is the base) when a call is refused or
-- its retry time is needed, and at about one call in eight (the time's last
-- bits). Either way the key expires `period` after its newest call.
local LOG_IN_STRING = 16
local LOG_STRING, LOG_SET = header('L'), header('S')
local TRIM = 1024

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
-- leave first, as the memory backend's log drops its front.
local function string_log(stored, now, period)
    if type(stored) ~= 'string' or (#stored - 4) % 8 ~= 0 or #stored > 4 + 8 * LOG_IN_STRING
        or string.sub(stored, 1, 4) ~= LOG_STRING then
        return nil
    end
    local at, stop = 5, #stored
    while at < stop and struct_unpack('>d', stored, at) + period <= now do at = at + 8 end
    return at, (stop + 1 - at) / 8
end

-- The `i`th oldest live time of a string log whose `n` live times start at
-- byte `at` of `stored`; past those, the units the call just added, at `t`.
local function log_time(stored, at, n, i, t)
    if i > n then return t end
    return struct_unpack('>d', stored, at + 8 * (i - 1))
end

-- The member at rank `rank` of a sorted-set log: through, units, score.
local function log_call(key, rank)
    local found = redis_call('ZRANGE', key, text(rank), text(rank), 'WITHSCORES')
    local through, units = struct_unpack('>dd', found[1])
    return through, units, tonumber(found[2])
end

-- How many calls of a sorted-set log have left the window at `now` (ranks
-- 1..gone), and the units counted before the window's first call.
local function log_window(key, now, period)
    local gone = redis_call('ZCOUNT', key, '0', text(now - period))
    if gone > 0 then return gone, (log_call(key, gone)) end
    local through, units = log_call(key, 1)
    return 0, through - units
end

-- The first rank in [lo, hi] whose call is counted through at least
-- `want` units (a bisection: `through` grows with the rank).
local function first_through(key, lo, hi, want)
    while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if log_call(key, mid) >= want then hi = mid else lo = mid + 1 end
    end
    return lo
end

-- The sorted-set log, `last` the rank of its newest call (rank 0 is
-- LOG_SET). Nil when nothing in it is live: the caller starts a string log.
local function sliding_log_set(key, now, slack, count, period, cost, last)
    if last < 1 then return nil end
    local newest, _, newest_at = log_call(key, last)
    local gone, base = log_window(key, now, period)
    local held = newest - base
    if held == 0 then return nil end

    local allowed, counted = 0, newest
    if held + cost <= count then
        allowed = 1
        newest, newest_at = newest + cost, math.max(now, newest_at)
        write('ZADD', key, text(newest_at), struct_pack('>dd', newest, cost))
        write('PEXPIRE', key, text(math.ceil(period / 1000) + slack))
        held = held + cost
    end
    local remaining = math.max(count - held, 0)
    if gone > 1 and (allowed == 0 or remaining < cost or now % 8 == 0) then
        local trimmed = math.min(gone - 1, TRIM)
        write('ZREMRANGEBYRANK', key, '1', text(trimmed))
        if not dry then gone, last = gone - trimmed, last - trimmed end
    end
    local retry = 0
    if remaining < cost then
        -- The oldest `held + cost - count` units must leave the window
        -- first: the first live call through them, found by bisection
        -- (the call just made, past the ones stored).
        local want = base + held + cost - count
        if want > counted then
            retry = newest_at + period - now
        else
            local _, _, at = log_call(key, first_through(key, gone + 1, last, want))
            retry = at + period - now
        end
    end
    return allowed, remaining, newest_at + period - now, retry
end

local function sliding_log(key, now, slack, count, burst, period, cost)
    -- The stored value as load() takes it (read ahead, or read here), but
    -- whole: a string log's length varies.
    local stored = take_pending(key)
    local at, held = string_log(stored, now, period)
    if not at then
        -- No string log: a sorted set of ours, or nothing (or anything else:
        -- a fresh start, as the memory backend makes).
        if type(redis_pcall('ZSCORE', key, LOG_SET)) == 'string' then
            local a, remaining, reset, retry = sliding_log_set(key, now, slack, count, period,
                cost, redis_call('ZCARD', key) - 1)
            if a then return a, remaining, reset, retry end
        end
        -- Nothing live: the string log starts (its SET replaces the key).
        stored, at, held = LOG_STRING, 5, 0
    end
    local stored_held = held
    -- Times never go back in a log.
    local t = now
    if held > 0 then t = math.max(now, struct_unpack('>d', stored, #stored - 7)) end
    local allowed = 0
    if held + cost <= count then
        allowed = 1
        local ttl = text(math.ceil(period / 1000) + slack)
        if held + cost <= LOG_IN_STRING then
            local added = packed_time(t)
            if cost > 1 then added = string.rep(added, cost) end
            write('SET', key, LOG_STRING .. string.sub(stored, at) .. added, 'PX', ttl)
        else
            -- Outgrown: a sorted set, a call per unit held, then this one.
            local args = {'-1', LOG_SET}
            for i = 1, held do
                args[#args + 1] = text(log_time(stored, at, stored_held, i, t))
                args[#args + 1] = struct_pack('>dd', i, 1)
            end
            args[#args + 1] = text(t)
            args[#args + 1] = struct_pack('>dd', held + cost, cost)
            write('DEL', key)
            write('ZADD', key, unpack(args))
            write('PEXPIRE', key, ttl)
        end
        held = held + cost
    end

    local remaining = math.max(count - held, 0)
    local reset = 0
    if allowed == 1 then
        reset = t + period - now -- the newest call is this one
    elseif held > 0 then
        reset = log_time(stored, at, stored_held, held, t) + period - now
    end
    local retry = 0
    if remaining < cost then
        -- The oldest `held + cost - count` units must leave the window first.
        retry = log_time(stored, at, stored_held, held + cost - count, t) + period - now
    end
    return allowed, remaining, reset, retry
end

-- Takes `units` back from the newest calls in the window (never more than
-- it holds).
local function sliding_log_refund(key, now, slack, count, burst, period, units)
    local stored = take_pending(key)
    local at, held = string_log(stored, now, period)
    if at then
        local keep = math.max(held - units, 0)
        if keep == 0 then
            write('DEL', key)
            return
        end
        local newest = struct_unpack('>d', stored, at + 8 * (keep - 1))
        write('SET', key, LOG_STRING .. string.sub(stored, at, at + 8 * keep - 1),
            'PX', text(math.ceil((newest + period - now) / 1000) + slack))
        return
    end
    if type(redis_pcall('ZSCORE', key, LOG_SET)) ~= 'string' then return end
    local last = redis_call('ZCARD', key) - 1
    if last < 1 then return end
    local newest = log_call(key, last)
    local gone, base = log_window(key, now, period)
    -- What is counted through the newest call once the units are back.
    local target = math.max(newest - units, base)
    if target == newest then return end
    -- The first live call counted past `target`: it keeps what it has up to
    -- `target`, every newer one goes.
    local lo = first_through(key, gone + 1, last, target + 1)
    local through, u, t = log_call(key, lo)
    write('ZREMRANGEBYRANK', key, text(lo), text(last))
    if through - u < target then
        write('ZADD', key, text(t), struct_pack('>dd', target, target - (through - u)))
    end
end
