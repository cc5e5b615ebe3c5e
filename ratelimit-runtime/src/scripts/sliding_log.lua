-- sliding_log: an exact sliding window on a sorted set of call times (seed 002,
-- as one atomic script). At most `count` units in any interval of length
-- `period`; the set never holds more than `count` members. Mirrors
-- sliding_log() in src/algorithm.rs.
--
-- KEYS[1]  sorted set: one member per unit, scored by its call time (µs)
-- ARGV     see prelude.lua
-- Returns  {allowed (1|0), remaining, reset_after (µs), retry_after (µs)}

-- A call at time t counts while now < t + period.
local trimmed = redis.pcall('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - period)
if type(trimmed) == 'table' then
    -- Another type under this key (another algorithm's state): start afresh,
    -- as the memory backend does.
    redis.call('DEL', KEYS[1])
end
local held = redis.call('ZCARD', KEYS[1])
local allowed = 0
if held + cost <= count then
    allowed = 1
    -- Members are unique: those already scored `now` have suffixes below `held`.
    -- In batches: unpack() has a stack limit.
    local args = {}
    for i = 0, cost - 1 do
        args[#args + 1] = now
        args[#args + 1] = string.format('%.0f:%d', now, held + i)
        if #args == 2000 or i == cost - 1 then
            redis.call('ZADD', KEYS[1], unpack(args))
            args = {}
        end
    end
    held = held + cost
    redis.call('PEXPIRE', KEYS[1], math.ceil(period / 1000) + slack)
end

local remaining = math.max(count - held, 0)
local reset = 0
if allowed == 1 then
    reset = period -- the newest call is this one
elseif held > 0 then
    local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
    reset = tonumber(newest[2]) + period - now
end
local retry = 0
if remaining < cost then
    -- The oldest `held + cost - count` calls must leave the window first.
    local index = held + cost - count - 1
    local needed = redis.call('ZRANGE', KEYS[1], index, index, 'WITHSCORES')
    retry = tonumber(needed[2]) + period - now
end
return {allowed, remaining, reset, retry}
