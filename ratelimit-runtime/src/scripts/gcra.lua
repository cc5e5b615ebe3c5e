-- gcra: the generic cell rate algorithm (leaky bucket as a meter): one
-- theoretical arrival time per key. Emission interval period/count µs, burst
-- tolerance burst * period/count. The TAT is kept exactly, as whole µs plus a
-- remainder in 1/count µs, so retry_after is exact. Mirrors gcra() in
-- src/algorithm.rs.
--
-- KEYS[1]  "G:tat:rem"
-- ARGV     count, burst, period (µs), cost, now (µs; "" = the server's TIME)
-- Returns  {allowed (1|0), remaining, reset_after (µs), retry_after (µs)}
local count, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local period, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local now, slack = tonumber(ARGV[5]), 3600000
if not now then
    local t = redis.call('TIME')
    now, slack = tonumber(t[1]) * 1000000 + tonumber(t[2]), 0
end

-- The numbers of this algorithm's state ("G:n:n..."), or nil when the key
-- holds nothing, another algorithm's state, or another type (treated as absent,
-- as the memory backend does; SET below replaces it).
local function load()
    local stored = redis.pcall('GET', KEYS[1])
    if type(stored) ~= 'string' or string.sub(stored, 1, 2) ~= 'G:' then return nil end
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

local tolerance = burst * period
-- How far the TAT is ahead of now, in 1/count µs.
local ahead = 0
local stored = load()
if stored then
    local tat, rem = stored[1], stored[2]
    if tat >= now then ahead = (tat - now) * count + rem end
end

local step = cost * period
local allowed = 0
if ahead + step <= tolerance then
    allowed = 1
    ahead = ahead + step
    local whole = idiv(ahead, count)
    -- Once the TAT has passed the key is the same as no key: expire then.
    redis.call('SET', KEYS[1], string.format('G:%.0f:%.0f', now + whole, ahead - whole * count),
        'PX', math.ceil(ceil_div(ahead, count) / 1000) + slack)
end

local retry = 0
if tolerance - ahead < step then retry = ceil_div(ahead + step - tolerance, count) end
-- ahead can exceed the tolerance only if the rule was tightened since it was stored.
return {allowed, idiv(math.max(tolerance - ahead, 0), period), ceil_div(ahead, count), retry}
