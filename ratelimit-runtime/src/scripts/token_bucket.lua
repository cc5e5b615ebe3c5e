-- token_bucket: `burst` tokens, refilled continuously at `count` per `period`,
-- starting full (seed 004, with one key instead of two and the server's clock
-- instead of the caller's). Tokens are fixed point, `period` units per token,
-- so a microsecond refills exactly `count` units and nothing is rounded; every
-- number stays below 2^53. Mirrors token_bucket() in src/algorithm.rs.
--
-- KEYS[1]  "T:tokens:last" (tokens in fixed point, last update in µs)
-- ARGV     count, burst, period (µs), cost, now (µs; "" = the server's TIME)
-- Returns  {allowed (1|0), remaining, reset_after (µs), retry_after (µs)}
local count, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local period, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local now, slack = tonumber(ARGV[5]), 3600000
if not now then
    local t = redis.call('TIME')
    now, slack = tonumber(t[1]) * 1000000 + tonumber(t[2]), 0
end

-- The numbers of this algorithm's state ("T:n:n..."), or nil when the key
-- holds nothing, another algorithm's state, or another type (treated as absent,
-- as the memory backend does; SET below replaces it).
local function load()
    local stored = redis.pcall('GET', KEYS[1])
    if type(stored) ~= 'string' or string.sub(stored, 1, 2) ~= 'T:' then return nil end
    local fields = {}
    for part in string.gmatch(string.sub(stored, 3), '[^:]+') do fields[#fields + 1] = tonumber(part) end
    return fields
end

-- Exact floor(a / b) for integers below 2^53 (a double quotient can round up).
local function idiv(a, b)
    local q = math.floor(a / b)
    if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
    return q
end
local function ceil_div(a, b) return idiv(a + b - 1, b) end

local capacity = burst * period
local tokens, last = capacity, now
local stored = load()
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
