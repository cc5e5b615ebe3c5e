
-- sliding_log: an exact sliding window on a sorted set of call times (seed 002,
-- as one atomic script). At most `count` units in any interval of length
-- `period`; the set never holds more than `count` members. Mirrors
-- sliding_log() in src/algorithm.rs.
--
-- key  sorted set: one member per unit, scored by its call time (µs)
local function sliding_log(key, now, slack, count, burst, period, cost)
    -- A call at time t counts while now < t + period.
    local held = trim_and_count(key, now - period)
    local allowed = 0
    if held + cost <= count then
        allowed = 1
        -- Members are unique: those already scored `now` have suffixes below
        -- `held`. The time is packed (8 bytes; cheaper than decimal text).
        add_units(key, cost, now, struct_pack('>d', now), held)
        held = held + cost
        redis_call('PEXPIRE', key, text(math.ceil(period / 1000) + slack))
    end

    local remaining = math.max(count - held, 0)
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
