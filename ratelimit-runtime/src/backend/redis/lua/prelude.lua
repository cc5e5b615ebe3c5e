-- Shared by every script: prepended when the crate is built. Each algorithm
-- is a function of one key:
--
--   check(key, now, slack, count, burst, period, cost, lease)
--     -> allowed (1|0), remaining, reset_after (µs), retry_after (µs)
--
-- `now` is in µs of the server clock; `slack` is added to every TTL (ms):
-- 0, or an hour when the caller fixed `now` (tests that hold Redis and memory
-- side by side: keys written then have times that are not the server's).
-- The script is bind.lua, this prelude, every algorithm of the registry and
-- the driver, batch.lua. It is also loaded as a function library where the
-- server has functions (src/backend/redis/scripts.rs): there the prelude and
-- the algorithms run once, at load, and the driver at each call.

-- The tables below (texts, aboves) hold what one script run made: each
-- driver makes them anew when it starts (a function library's are kept
-- between calls otherwise).

-- Numbers go to redis.call as text made here. Given a Lua number, Redis
-- formats it with "%.17g", a floating-point conversion that costs the server
-- about as much as a fast command; an integer prints exactly with %d. The
-- checks of a batch share most of their numbers (the time, a rule's TTL), so
-- each is made once per script run.
local texts
local function text(n)
    local t = texts[n]
    if not t then
        t = string.format('%d', n)
        texts[n] = t
    end
    return t
end
-- The exclusive bound "(n" (scores above n), made once per script run too.
local aboves
local function above(n)
    local t = aboves[n]
    if not t then
        t = '(' .. text(n)
        aboves[n] = t
    end
    return t
end

-- Exact floor(a / b) for integers below 2^53 (a double quotient can round up).
local function idiv(a, b)
    local q = math.floor(a / b)
    if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
    return q
end
local function ceil_div(a, b) return idiv(a + b - 1, b) end

-- String states are a tag byte and `n` big-endian doubles (integers below
-- 2^53, so exact): `tag .. struct.pack(...)`. Packing is several times
-- cheaper for the server than formatting and parsing decimal text.
--
-- The numbers of the state tagged `tag` (the tag's byte, e.g. 70 for "F")
-- holding `n` numbers, or nil when the key holds nothing, another
-- algorithm's state, or another type (treated as absent, as the memory
-- backend does; the script's SET replaces it).
--
-- A batch reads most of its string states ahead, in one MGET (see
-- batch.lua): `pending` is the value read for the check about to run (false:
-- none, or not a string), or nil when it was not read ahead (a later check
-- of a key already checked in the batch): then it is read here. A GET of
-- another type answers an error table, and MGET false: neither is a string
-- of the state's length.
local pending
local function load(key, tag, n)
    local stored = pending
    if stored == nil then stored = redis_pcall('GET', key) end
    pending = nil
    if not stored or #stored ~= 1 + 8 * n then return nil end
    if n == 2 then
        local t, a, b = struct_unpack('>Bdd', stored)
        if t == tag then return a, b end
        return nil
    end
    local t, a, b, c = struct_unpack('>Bddd', stored)
    if t == tag then return a, b, c end
    return nil
end

-- Adds `cost` members "prefix:first" .. "prefix:first+cost-1" scored `score`
-- to the sorted set (in batches: unpack() has a stack limit).
local function add_units(key, cost, score, prefix, first)
    if cost == 1 then
        redis_call('ZADD', key, text(score), prefix .. ':' .. text(first))
        return
    end
    local args = {}
    score = text(score)
    for i = 0, cost - 1 do
        args[#args + 1] = score
        -- Joined, not formatted: Lua's "%s" cuts a string at its first zero
        -- byte, and prefixes are packed bytes.
        args[#args + 1] = prefix .. ':' .. text(first + i)
        if #args == 2000 or i == cost - 1 then
            redis_call('ZADD', key, unpack(args))
            args = {}
        end
    end
end

-- The score of the sorted set's member at rank `index` (-1: the last).
local function score_at(key, index)
    return tonumber(redis_call('ZRANGE', key, text(index), text(index), 'WITHSCORES')[2])
end
