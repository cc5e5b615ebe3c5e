
-- concurrency: at most `count` units in flight. Each call holds a lease (one
-- member per unit, scored by when it expires) until it is released with ZREM
-- or `period` passes (its holder is taken for dead). Mirrors acquire() in
-- src/algorithm.rs.
--
-- key  sorted set of leases: member "lease:unit", score = expiry (µs)
local function concurrency(key, now, slack, count, burst, period, cost, lease)
    -- Leases whose holders died (expired) no longer count.
    local held = trim_and_count(key, now)
    local allowed = 0
    if held + cost <= count then
        allowed = 1
        add_units(key, cost, now + period, lease, 0)
        held = held + cost
        redis.call('PEXPIRE', key, text(math.ceil(period / 1000) + slack))
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
        retry = score_at(key, held + cost - count - 1) - now
    end
    return allowed, remaining, reset, retry
end
