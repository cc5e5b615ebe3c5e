-- fixed_window: a counter that starts at the first call and expires `period` later
-- (the seeds' INCR + PEXPIRE counter, made atomic, with rejected calls consuming nothing).
--
-- KEYS[1]  the counter
-- ARGV[1]  limit: units allowed per window
-- ARGV[2]  period: the window's length in milliseconds
-- ARGV[3]  cost: units this call takes (1 <= cost <= limit, checked by the caller)
--
-- Returns {allowed (1 or 0), remaining units, milliseconds until the window ends}.
-- Time is the Redis server's own: the key's TTL is the window.
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local used = tonumber(redis.call('GET', KEYS[1]) or 0)
local ttl = period
if used > 0 then
    ttl = redis.call('PTTL', KEYS[1])
    if ttl < 0 then
        -- A counter without a TTL (written by something else) would block forever:
        -- give it one.
        redis.call('PEXPIRE', KEYS[1], period)
        ttl = period
    end
end

if used + cost > limit then
    return {0, math.max(limit - used, 0), ttl}
end
if used == 0 then
    redis.call('SET', KEYS[1], cost, 'PX', period)
else
    redis.call('INCRBY', KEYS[1], cost)
end
return {1, limit - used - cost, ttl}
