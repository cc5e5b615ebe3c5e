
-- batch: many checks in one script run, each on its own key, each with its
-- own rule; the server's clock is read once for all of them. Concurrent
-- checks on one connection are coalesced into one of these (see
-- src/backend/redis.rs): one round trip and one script call carry many
-- checks, each still atomic (the whole script is).
--
-- KEYS     one key per check
-- ARGV[1]  7 big-endian doubles per check (packed: the server parses no
--          text): what (1-6: the algorithm, in the order of Algorithm::ALL;
--          7: release a lease), count, burst, period (µs), cost, now (µs;
--          -1 = the server's TIME), and where its lease id is (the index of
--          an ARGV holding it; 0 = none)
-- ARGV[2..] the lease ids (decimal text: 64 bits do not fit a double)
-- Returns  4 big-endian doubles per check, packed in one string (the
--          client parses no text either): allowed (1|0), remaining,
--          reset_after (µs), retry_after (µs) (a release answers 1, 0, 0, 0)

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
local out, time, released, packed, pos = {}, nil, nil, ARGV[1], 1
for i = 1, #KEYS do
    local what, count, burst, period, cost, now, lease
    what, count, burst, period, cost, now, lease, pos = struct.unpack('>ddddddd', packed, pos)
    if what == 7 then
        -- A release needs no time, and its answer is always the same.
        release(KEYS[i], cost, ARGV[lease])
        released = released or struct.pack('>dddd', 1, 0, 0, 0)
        out[i] = released
    else
        local slack = 3600000
        if now < 0 then
            if not time then
                local t = redis.call('TIME')
                time = tonumber(t[1]) * 1000000 + tonumber(t[2])
            end
            now, slack = time, 0
        end
        local allowed, remaining, reset, retry = run[what](KEYS[i], now, slack, count, burst,
            period, cost, ARGV[lease])
        out[i] = struct.pack('>dddd', allowed, remaining, reset, retry)
    end
end
return table.concat(out)
