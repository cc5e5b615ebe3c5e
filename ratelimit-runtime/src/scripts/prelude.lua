-- Shared by every script: prepended when the crate is built (Redis runs each
-- script on its own, so each is the prelude plus one algorithm).
--
-- ARGV  count, burst, period (µs), cost, now (µs; "" = the server's TIME)
--       [, lease id for concurrency]
-- A fixed `now` is for tests that hold Redis and memory side by side; keys
-- written with it get an hour's slack on their TTL, since their times are not
-- the server's.
local count, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local period, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local now, slack = tonumber(ARGV[5]), 3600000
if not now then
    local t = redis.call('TIME')
    now, slack = tonumber(t[1]) * 1000000 + tonumber(t[2]), 0
end

-- Exact floor(a / b) for integers below 2^53 (a double quotient can round up).
local function idiv(a, b)
    local q = math.floor(a / b)
    if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
    return q
end
local function ceil_div(a, b) return idiv(a + b - 1, b) end

-- The numbers of a string state tagged `tag` ("T:n:n..."), or nil when the
-- key holds nothing, another algorithm's state, or another type (treated as
-- absent, as the memory backend does; the script's SET replaces it).
local function load(tag)
    local stored = redis.pcall('GET', KEYS[1])
    if type(stored) ~= 'string' or string.sub(stored, 1, 2) ~= tag .. ':' then return nil end
    local fields = {}
    for part in string.gmatch(string.sub(stored, 3), '[^:]+') do fields[#fields + 1] = tonumber(part) end
    return fields
end

-- Adds `cost` members "prefix:first" .. "prefix:first+cost-1" scored `score`
-- to the sorted set (in batches: unpack() has a stack limit).
local function add_units(score, prefix, first)
    local args = {}
    for i = 0, cost - 1 do
        args[#args + 1] = score
        args[#args + 1] = string.format('%s:%d', prefix, first + i)
        if #args == 2000 or i == cost - 1 then
            redis.call('ZADD', KEYS[1], unpack(args))
            args = {}
        end
    end
end

-- The score of the sorted set's member at rank `index` (-1: the last).
local function score_at(index)
    return tonumber(redis.call('ZRANGE', KEYS[1], index, index, 'WITHSCORES')[2])
end

