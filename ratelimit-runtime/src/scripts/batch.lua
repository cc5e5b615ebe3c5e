
-- batch: many checks in one script run, each on its own key, each with its
-- own rule; the server's clock is read once for all of them. Concurrent
-- checks on one connection are coalesced into one of these (see
-- src/backend/redis.rs): one round trip and one script call carry many
-- checks, each still atomic (the whole script is).
--
-- KEYS     one key per check, then one per release
-- ARGV[1]  the checks: 7 big-endian doubles each (packed: the server parses
--          no text): what (1-6: the algorithm, in the order of
--          Algorithm::ALL), count, burst, period (µs), cost, now (µs; -1 =
--          the server's TIME), and where its lease id is (the index of an
--          ARGV holding it; 0 = none)
-- ARGV[2]  the costs of the releases, one big-endian double each (empty:
--          every release is of one unit)
-- ARGV[3..] the lease ids (decimal text: 64 bits do not fit a double): the
--          checks' (where they say), then one per release, in order
-- Returns  4 big-endian doubles per check, packed in one string (the
--          client parses no text either): allowed (1|0), remaining,
--          reset_after (µs), retry_after (µs). Releases answer nothing.

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
local out, time, packed, pos = {}, nil, ARGV[1], 1
local checks = #packed / 56
for i = 1, checks do
    local what, count, burst, period, cost, now, lease
    what, count, burst, period, cost, now, lease, pos = struct.unpack('>ddddddd', packed, pos)
    local slack = 3600000
    if now < 0 then
        if not time then
            local t = redis.call('TIME')
            time = tonumber(t[1]) * 1000000 + tonumber(t[2])
        end
        now, slack = time, 0
    end
    out[i] = struct.pack('>dddd', run[what](KEYS[i], now, slack, count, burst, period, cost,
        ARGV[lease]))
end
-- A release needs no time, and its caller no answer.
local costs, cost, lease = ARGV[2], 1, #ARGV - (#KEYS - checks)
pos = 1
for i = checks + 1, #KEYS do
    if #costs > 0 then cost, pos = struct.unpack('>d', costs, pos) end
    lease = lease + 1
    release(KEYS[i], cost, ARGV[lease])
end
return table.concat(out)
