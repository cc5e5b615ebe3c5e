-- fixed_window: a counter that starts at a key's first call and ends `period`
-- later (the seeds' INCR + PEXPIRE counter, made atomic: a refused call writes
-- nothing). Mirrors fixed_window() in src/algorithm.rs.
--
-- KEYS[1]  the counter: "F:used:ends" (ends in µs of the server clock)
-- ARGV     count, burst, period (µs), cost, now (µs; "" = the server's TIME)
-- Returns  {allowed (1|0), remaining, reset_after (µs), retry_after (µs)}
local count, period, cost = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now, slack = tonumber(ARGV[5]), 3600000
if not now then
    local t = redis.call('TIME')
    now, slack = tonumber(t[1]) * 1000000 + tonumber(t[2]), 0
end

-- The numbers of this algorithm's state ("F:n:n..."), or nil when the key
-- holds nothing, another algorithm's state, or another type (treated as absent,
-- as the memory backend does; SET below replaces it).
local function load()
    local stored = redis.pcall('GET', KEYS[1])
    if type(stored) ~= 'string' or string.sub(stored, 1, 2) ~= 'F:' then return nil end
    local fields = {}
    for part in string.gmatch(string.sub(stored, 3), '[^:]+') do fields[#fields + 1] = tonumber(part) end
    return fields
end

local used, ends = 0, now + period
local stored = load()
if stored and now < stored[2] then used, ends = stored[1], stored[2] end

local reset = ends - now
if used + cost > count then
    return {0, math.max(count - used, 0), reset, reset}
end
used = used + cost
-- The key lives exactly as long as the window (+ slack when the caller fixes the time).
redis.call('SET', KEYS[1], string.format('F:%.0f:%.0f', used, ends),
    'PX', math.ceil(reset / 1000) + slack)
local remaining = count - used
local retry = 0
if remaining < cost then retry = reset end
return {1, remaining, reset, retry}
