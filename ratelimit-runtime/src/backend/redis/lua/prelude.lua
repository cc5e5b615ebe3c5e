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

-- String states are a header and `n` big-endian doubles (integers below
-- 2^53, so exact): `header .. struct.pack(...)`. Packing is several times
-- cheaper for the server than formatting and parsing decimal text. The
-- header is "rl", the format's version (a byte) and the algorithm's tag
-- byte: with the exact length, it tells our state from a value someone else
-- left under the prefix, which is never read as state (and is replaced by
-- the next write, which sets a TTL). A state of an earlier version is read
-- as such, and written in the current one.
-- (Made when a function library loads, where `string` is not yet there.)
local function header(version, tag)
    if version == 1 then return 'rl\1' .. tag end
    return 'rl\2' .. tag
end

-- The numbers of `stored` if it is a state under `head` holding `n` numbers
-- (2 to 4), else nil: nothing, another algorithm's state, or anything else
-- (treated as absent, as the memory backend does; the script's SET
-- replaces it).
local function parse(stored, head, n)
    if type(stored) ~= 'string' or #stored ~= 4 + 8 * n then return nil end
    local h, a, b, c, d
    if n == 2 then
        h, a, b = struct_unpack('>c4dd', stored)
    elseif n == 3 then
        h, a, b, c = struct_unpack('>c4ddd', stored)
    else
        h, a, b, c, d = struct_unpack('>c4dddd', stored)
    end
    if h == head then return a, b, c, d end
    return nil
end

-- A batch reads most of its string states ahead, in one MGET (see
-- batch.lua): `pending` is the value read for the check about to run (false:
-- none, or not a string), or nil when it was not read ahead (a later check
-- of a key already checked in the batch): then it is read here. A GET of
-- another type answers an error table, and MGET false: neither is a string
-- of the state's length.
local pending
-- The value read ahead for this check, or read now.
local function take_pending(key)
    local stored = pending
    if stored == nil then stored = redis_pcall('GET', key) end
    pending = nil
    return stored
end
local function load(key, head, n)
    return parse(take_pending(key), head, n)
end

-- Whether the batch's keys are of several slots of a cluster master (the
-- library's `node` function; see batch.lua).
local spread = false

-- Whether the batch is one call under several rules, all or nothing
-- (src/backend/redis/stacked.rs; see batch.lua).
local whole = false

-- Whether the job being run only looks (a peek, or the answer after a
-- refund or a reset): its writes are skipped. Every write of an algorithm
-- goes through `write`.
local dry = false
local function write(...)
    if not dry then return redis_call(...) end
end

-- Makes `key` live at least `ms` ms more, never less. A key's TTL is set
-- for the rule it was written under: an override that lengthens the
-- period or lowers the rate needs its state kept longer, or the budget
-- comes back whole when the key goes.
local function outlive(key, ms)
    if not dry and redis_call('PTTL', key) < ms then
        redis_call('PEXPIRE', key, text(ms))
    end
end

-- Subjects' own limits (a rule built `with_subject_limits`): a hash of
-- `count` and `burst` at a key of the budget key's slot, its name the
-- budget key's and "#limit", the budget key braced first when it has no
-- hash tag (src/keys.rs, `limit_key`, makes the same); nil for a key with a
-- "}" but no tag, which has no such key. `applied` holds the counts that
-- applied in this run, by budget key (the drivers answer them).
local applied
local function limit_key(key)
    local open = string.find(key, '{', 1, true)
    if open then
        local close = string.find(key, '}', open + 1, true)
        if close and close > open + 1 then return key .. '#limit' end
    end
    if string.find(key, '}', 1, true) then return nil end
    return '{' .. key .. '}#limit'
end
-- A whole number from 1 to a billion (the most a rule's count may be).
local function limit_number(value)
    local n = tonumber(value)
    if n and n >= 1 and n <= 1000000000 and n == math.floor(n) then return n end
    return nil
end
-- The count and burst in force for `key`: its own, where it has a valid
-- one, else the rule's. A bucket's (`limits` 2) burst × period stays under
-- 2^52.
local function subject_limit(key, count, burst, period, limits)
    local at = limit_key(key)
    if not at then return count, burst end
    local stored = redis_pcall('HMGET', at, 'count', 'burst')
    if type(stored) ~= 'table' or stored.err then return count, burst end
    local own = limit_number(stored[1])
    if not own then return count, burst end
    local bucket = limit_number(stored[2]) or own
    if limits == 2 and bucket * period > 4503599627370496 then return count, burst end
    applied[key] = own
    return own, bucket
end

-- The answer: the numbers `out` holds for `checks` checks (of `keys`) and
-- the time, packed; then, where a subject's own limit applied in this run,
-- the count in force for each check (0: the rule's).
local function answer(out, checks, keys)
    local n = 4 * checks + 1
    if next(applied) then
        for i = 1, checks do out[n + i] = applied[keys[i]] or 0 end
        n = n + checks
    end
    return struct_pack('>' .. string.rep('d', n), unpack(out, 1, n))
end

-- One job on `key`: a check (`first` nil), or a look (`first` the op's
-- `before`: `true` for a peek, else a refund's or a reset's function, run
-- first: a refund's `id` is the stamp of the charge it gives back), which
-- then answers what a check of cost 1 would, writing nothing. `pending` is
-- set by the caller (see `take_pending`). Both drivers, batch.lua and
-- one.lua, run every job through this.
--
-- `limits` (0 or nil: none) says the rule reads its subjects' own limits:
-- 1 where its capacity is its count, 2 where it is its burst. A check
-- whose cost is over the subject's capacity is refused (it never fits).
local function step(check, first, key, now, slack, count, burst, period, cost, id, limits)
    if limits and limits > 0 then
        count, burst = subject_limit(key, count, burst, period, limits)
        if not first and cost > (limits == 2 and burst or count) then
            return 0, 0, 0, period
        end
    end
    if not first then
        return check(key, now, slack, count, burst, period, cost, id)
    end
    if first ~= true then
        first(key, now, slack, count, burst, period, cost, id)
        pending = nil
    end
    dry = true
    local allowed, remaining, reset_after, retry_after =
        check(key, now, slack, count, burst, period, 1, '0')
    dry = false
    return allowed, remaining, reset_after, retry_after
end

-- A key's state gone, whatever holds it (a reset; leases too). UNLINK:
-- the memory of a large sorted set is freed in the background, so the
-- call's own work does not grow with it.
local function reset(key)
    redis_call('UNLINK', key)
end

-- The score of the sorted set's member at rank `index` (-1: the last).
local function score_at(key, index)
    return tonumber(redis_call('ZRANGE', key, text(index), text(index), 'WITHSCORES')[2])
end

-- Waiting (the buckets' `<name>_reserve` and `<name>_cancel`; mirrors
-- src/algorithm/mod.rs). The longest wait a reservation may be made for:
-- 2^52 / count µs, so that a reserved position stays below 2^53.
local function wait_cap(count) return idiv(4503599627370495, count) end
-- A cancel's `id`: "<at>:<position>", when the reservation was made and
-- the position it answered.
local function reservation(id)
    local at, position = string.match(id, '^(%d+):(%d+)$')
    return tonumber(at), tonumber(position)
end
-- How much of a reservation of `cost` made at `at` and answered `position`
-- a cancel at `now` gives back, the bucket being `ahead` (1/count µs) short
-- of full now and begun at `born`; nil: nothing. Nothing once its time to
-- go has come, nor in a bucket begun since; less by what later
-- reservations took after it (their times stay).
local function given_back(count, burst, period, now, cost, at, position, ahead, born)
    local tolerance = burst * period
    if not at or now < at or born > at or position <= tolerance then return nil end
    if now >= at + ceil_div(position - tolerance, count) then return nil end
    local later = ahead + (now - at) * count - position
    local step = cost * period
    if later < 0 or later >= step then return nil end
    return step - later
end
