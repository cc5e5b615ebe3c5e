-- sliding_log: an exact sliding window on a sorted set of call times (seed 002,
-- as one atomic script). At most `count` units in any interval of length
-- `period`. Mirrors sliding_log() in src/algorithm.rs.
--
-- key  sorted set: one member per unit, scored by its call time (µs)
--
-- Calls older than the window are never counted (ZCOUNT counts the live
-- ones), so they need not be removed at every call: they are trimmed when a
-- call is refused or its retry time needs the live calls' ranks, and at
-- about one call in eight (the time's last bits), which bounds what the set
-- holds beyond `count`; the key itself expires `period` after its newest call.
local function sliding_log(key, now, slack, count, burst, period, cost)
    -- A call at time t counts while now < t + period.
    local held = redis_pcall('ZCOUNT', key, above(now - period), '+inf')
    if type(held) == 'table' then
        -- Another algorithm's state: a fresh start, as the memory backend makes.
        redis_call('DEL', key)
        held = 0
    end
    local allowed = 0
    if held + cost <= count then
        allowed = 1
        -- Members are unique: those already scored `now` are live and have
        -- suffixes below `held`. The time is packed (8 bytes; cheaper than
        -- decimal text).
        add_units(key, cost, now, struct_pack('>d', now), held)
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
