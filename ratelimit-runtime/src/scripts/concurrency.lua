
-- concurrency: at most `count` units in flight. Each call holds a lease (one
-- member per unit, scored by when it expires) until it is released with ZREM
-- or `period` passes (its holder is taken for dead). Mirrors acquire() in
-- src/algorithm.rs.
--
-- key  sorted set of leases: member "lease" (one unit) or "lease:unit",
--      score = expiry (µs)
--
-- Leases scored up to `now` are dead and never counted (ZCOUNT counts the
-- live ones), so they need not be removed at every call: they are trimmed
-- at a refusal and at about one acquire in ten (the lease id's last digit,
-- random), which bounds what dead holders leave behind. The key itself
-- expires with its newest lease.
local function concurrency(key, now, slack, count, burst, period, cost, lease)
    local live = above(now)
    local held = redis.pcall('ZCOUNT', key, live, '+inf')
    if type(held) == 'table' then
        -- Another algorithm's state: a fresh start, as the memory backend makes.
        redis.call('DEL', key)
        held = 0
    end
    local allowed = 0
    if held + cost <= count then
        allowed = 1
        if cost == 1 then
            redis.call('ZADD', key, text(now + period), lease)
        else
            add_units(key, cost, now + period, lease, 0)
        end
        held = held + cost
        redis.call('PEXPIRE', key, text(math.ceil(period / 1000) + slack))
    end
    if allowed == 0 or string.byte(lease, -1) == 48 then
        redis.call('ZREMRANGEBYSCORE', key, '-inf', text(now))
    end

    local remaining = math.max(count - held, 0)
    local reset = 0
    if allowed == 1 then
        reset = period -- the newest lease is this one
    elseif held > 0 then
        reset = score_at(key, -1) - now
    end
    local retry = 0
    if remaining < cost then
        -- The live lease holding unit number `held + cost - count` (1-based)
        -- must go first.
        retry = tonumber(redis.call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES',
            'LIMIT', text(held + cost - count - 1), '1')[2]) - now
    end
    return allowed, remaining, reset, retry
end
