
-- batch: many checks in one script run, each on its own key, each with its
-- own rule; the server's clock is read once for all of them. Concurrent
-- checks on one connection are coalesced into one of these (see
-- src/backend/redis.rs): one round trip and one script call carry many
-- checks, each still atomic (the whole script is).
--
-- KEYS     one key per check, then one per release
-- ARGV[1]  the rules of the batch, 6 big-endian doubles each (packed: the
--          server parses no text): what (1-6: the algorithm, in the order
--          of Algorithm::ALL), count, burst, period (µs), now (µs; -1 = the
--          server's TIME), and whether its checks carry a lease id (1|0)
-- ARGV[2]  one byte per check: the number of its rule in ARGV[1]
-- ARGV[3]  the costs, one big-endian double per check, then per release
--          (empty: every cost is 1)
-- ARGV[4]  how many checks, first in KEYS, keep their state in a string
--          (fixed window, sliding window, token bucket, GCRA): their keys are
--          read at once, in one MGET (see `ahead` in prelude.lua)
-- ARGV[5..] the lease ids (decimal text: 64 bits do not fit a double): one
--          per check whose rule says so, in order, then one per release
-- Returns  4 big-endian doubles per check, packed in one string (the
--          client parses no text either): allowed (1|0), remaining,
--          reset_after (µs), retry_after (µs). Releases answer nothing.
--
-- A check's rule is unpacked once per batch, not once per check: most
-- checks of a batch share a few rules.

-- Gives back the units of a concurrency lease (the limiter's release).
local function release(key, cost, lease)
    if cost == 1 then
        redis.call('ZREM', key, lease)
    else
        local members = {}
        for unit = 0, cost - 1 do
            members[#members + 1] = lease .. ':' .. text(unit)
            if #members == 4000 or unit == cost - 1 then
                redis.call('ZREM', key, unpack(members))
                members = {}
            end
        end
    end
end

local run = {fixed_window, sliding_log, sliding_window, token_bucket, gcra, concurrency}
local packed, order, costs = ARGV[1], ARGV[2], ARGV[3]
local checks, time = #order, nil
local rules = {}
for r = 1, #packed / 48 do
    local what, count, burst, period, now, leased = struct.unpack('>dddddd', packed, 48 * r - 47)
    local slack = 3600000
    if now < 0 then
        if not time then
            local t = redis.call('TIME')
            time = tonumber(t[1]) * 1000000 + tonumber(t[2])
        end
        now, slack = time, 0
    end
    rules[r] = {run[what], now, slack, count, burst, period, leased == 1}
end

-- The string states, read ahead: each key once.
local names, n = {}, 0
for i = 1, tonumber(ARGV[4]) do
    local key = KEYS[i]
    if ahead[key] == nil then
        ahead[key] = false
        n = n + 1
        names[n] = key
    end
end
if n > 0 then
    local values = redis.call('MGET', unpack(names))
    for j = 1, n do ahead[names[j]] = values[j] end
end

local out, lease, cost = {}, 4, 1
for i = 1, checks do
    local rule, key, id = rules[string.byte(order, i)], KEYS[i], nil
    if #costs > 0 then cost = struct.unpack('>d', costs, 8 * i - 7) end
    if rule[7] then
        lease = lease + 1
        id = ARGV[lease]
    end
    out[i] = struct.pack('>dddd', rule[1](key, rule[2], rule[3], rule[4], rule[5], rule[6],
        cost, id))
    -- What was read ahead is stale once the key's first check ran.
    ahead[key] = nil
end
-- A release needs no time, and its caller no answer.
for i = checks + 1, #KEYS do
    if #costs > 0 then cost = struct.unpack('>d', costs, 8 * i - 7) end
    lease = lease + 1
    release(KEYS[i], cost, ARGV[lease])
end
return table.concat(out)
