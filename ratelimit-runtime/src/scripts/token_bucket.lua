-- token_bucket: `burst` tokens, refilled continuously at `count` per `period`,
-- starting full (seed 004, with one key instead of two and the server's clock
-- instead of the caller's). Tokens are fixed point, `period` units per token,
-- so a microsecond refills exactly `count` units and nothing is rounded; every
-- number stays below 2^53. Mirrors token_bucket() in src/algorithm.rs.
--
-- KEYS[1]  "T:tokens:last" (tokens in fixed point, last update in µs)
-- ARGV     see prelude.lua
-- Returns  {allowed (1|0), remaining, reset_after (µs), retry_after (µs)}

local capacity = burst * period
local tokens, last = capacity, now
local stored = load('T')
if stored then
    tokens, last = stored[1], stored[2]
    -- Kept under a larger burst, before the rule was changed.
    tokens = math.min(tokens, capacity)
end

local elapsed = math.max(now - last, 0)
if elapsed >= ceil_div(capacity - tokens, count) then
    tokens = capacity
else
    tokens = tokens + elapsed * count
end

local need = cost * period
local allowed = 0
if tokens >= need then
    allowed = 1
    tokens = tokens - need
    -- Once full again the bucket is the same as no key: expire then.
    redis.call('SET', KEYS[1], string.format('T:%.0f:%.0f', tokens, now),
        'PX', math.ceil(ceil_div(capacity - tokens, count) / 1000) + slack)
end

local retry = 0
if tokens < need then retry = ceil_div(need - tokens, count) end
return {allowed, idiv(tokens, period), ceil_div(capacity - tokens, count), retry}
