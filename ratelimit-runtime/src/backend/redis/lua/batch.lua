
-- batch: many checks in one script run, each on its own key, each with its
-- own rule; the server's clock is read once for all of them. Concurrent
-- checks on one connection are coalesced into one of these (see
-- src/backend/redis/batch.rs): one round trip and one script call carry many
-- checks, each still atomic (the whole script is).
--
-- KEYS     one key per check, then one per release
-- ARGV[1]  the rules of the batch, 6 big-endian doubles each (packed: the
--          server parses no text): the algorithm's op id (its place in
--          the registry, src/algorithm/mod.rs, plus one; `run` below is
--          written from it), count, burst, period (µs), now (µs; -1 = the
--          server's TIME), and whether its checks carry a lease id (1|0)
-- ARGV[2]  one byte per check: the number of its rule in ARGV[1]
-- ARGV[3]  the costs, one big-endian double per check, then per release
--          (empty: every cost is 1)
-- ARGV[4]  how many checks, first in KEYS, keep their state in a string
--          (every algorithm but concurrency; a long sliding log is a sorted
--          set, which MGET reads as none) and are the
--          first of their key in the batch: their keys, all different, are
--          read at once, in one MGET (see `pending` in prelude.lua). A
--          string state's later checks of the same key come after them.
-- ARGV[5..] the lease ids (decimal text: 64 bits do not fit a double): one
--          per check whose rule says so, in order, then one per release
-- Returns  4 big-endian doubles per check, packed in one string (the
--          client parses no text either): allowed (1|0), remaining,
--          reset_after (µs), retry_after (µs). Releases answer nothing.
--
-- A check's rule is unpacked once per batch, not once per check: most
-- checks of a batch share a few rules.

texts, aboves = {}, {}
local packed, order, costs = ARGV[1], ARGV[2], ARGV[3]
local checks, time = #order, nil
local rules = {}
for r = 1, #packed / 48 do
    local what, count, burst, period, now, leased = struct_unpack('>dddddd', packed, 48 * r - 47)
    local slack = 3600000
    if now < 0 then
        if not time then
            local t = redis_call('TIME')
            time = tonumber(t[1]) * 1000000 + tonumber(t[2])
        end
        now, slack = time, 0
    end
    rules[r] = {run[what], now, slack, count, burst, period, leased == 1}
end

-- The string states read ahead, in one MGET: the first checks, each of its
-- own key (the client puts a key's later checks after them).
local values, reads = {}, tonumber(ARGV[4])
if reads > 0 then values = redis_call('MGET', unpack(KEYS, 1, reads)) end

-- Most batches hold checks of one rule: then no check looks its rule up,
-- and its numbers stay in locals.
local only, costed = #rules == 1, #costs > 0
local check, now, slack, count, burst, period, leased = unpack(rules[1] or {})
local out, lease, cost = {}, 4, 1
for i = 1, checks do
    local id = nil
    if not only then
        check, now, slack, count, burst, period, leased = unpack(rules[string_byte(order, i)])
    end
    if costed then cost = struct_unpack('>d', costs, 8 * i - 7) end
    if leased then
        lease = lease + 1
        id = ARGV[lease]
    end
    pending = values[i]
    local n = 4 * i
    out[n - 3], out[n - 2], out[n - 1], out[n] =
        check(KEYS[i], now, slack, count, burst, period, cost, id)
end
-- A release needs no time, and its caller no answer.
for i = checks + 1, #KEYS do
    if costed then cost = struct_unpack('>d', costs, 8 * i - 7) end
    lease = lease + 1
    release(KEYS[i], cost, ARGV[lease])
end
-- The answers packed in one call (a call of the struct library costs about
-- as much for one number as for many).
if checks == 0 then return '' end
return struct_pack('>' .. string.rep('d', 4 * checks), unpack(out))
