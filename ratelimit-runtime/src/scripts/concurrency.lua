-- concurrency: at most `count` units in flight. Each call holds a lease (one
-- member per unit, scored by when it expires) until it is released with ZREM
-- or `period` passes (its holder is taken for dead). Mirrors acquire() in
-- src/algorithm.rs.
--
-- KEYS[1]  sorted set of leases: member "lease:unit", score = expiry (µs)
-- ARGV     see prelude.lua (and the lease id)
-- Returns  {allowed (1|0), remaining, reset_after (µs), retry_after (µs)}

local trimmed = redis.pcall('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if type(trimmed) == 'table' then
    -- Another type under this key (another algorithm's state): start afresh,
    -- as the memory backend does.
    redis.call('DEL', KEYS[1])
end
local held = redis.call('ZCARD', KEYS[1])
local allowed = 0
if held + cost <= count then
    allowed = 1
    add_units(now + period, ARGV[6], 0)
    held = held + cost
    redis.call('PEXPIRE', KEYS[1], math.ceil(period / 1000) + slack)
end

local remaining = math.max(count - held, 0)
local reset = 0
if allowed == 1 then
    reset = period -- the newest lease is this one
elseif held > 0 then
    reset = score_at(-1) - now
end
local retry = 0
if remaining < cost then
    retry = score_at(held + cost - count - 1) - now
end
return {allowed, remaining, reset, retry}
