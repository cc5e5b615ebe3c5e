-- one: a call that goes alone (a check, a look or a release), without what a
-- batch needs (its tables of rules, its MGET, its list of answers): about 2
-- µs less of the server's time a call. Loaded in the function library only,
-- next to batch.lua, and running the same algorithm functions, so it
-- answers exactly what a batch of one would.
--
-- The wire protocol (src/backend/redis/codec.rs, `encode_one`): KEYS[1] the
-- key; ARGV[1] 8 packed doubles: op id, count, burst, period, now or -1 (the
-- server's clock), cost, deadline in server time (2^53: none), subject
-- limits (see `step`); ARGV[2] the lease id (or the stamp a refund names),
-- if any. The answer is a batch of one's: 4 packed doubles (allowed 2: past
-- its deadline, not run), then the server's time (-1: not read), then the
-- subject's own count where one applied; a release answers the time only.

texts, aboves, applied, dry, pending = {}, {}, {}, false, nil
local what, count, burst, period, now, cost, deadline, limits =
    struct_unpack('>dddddddd', ARGV[1])
local key = KEYS[1]
if what == RELEASE then
    release(key, cost, ARGV[2])
    return struct_pack('>d', -1)
end
local time, slack = -1, 3600000
if now < 0 then
    local t = redis_call('TIME')
    time = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now, slack = time, 0
    if deadline < time then
        -- Its caller has stopped waiting: counting it would be a phantom.
        return struct_pack('>ddddd', 2, 0, 0, 0, time)
    end
end
local allowed, remaining, reset_after, retry_after =
    step(run[what], before[what], key, now, slack, count, burst, period, cost, ARGV[2], limits)
if applied[key] then
    return struct_pack('>dddddd', allowed, remaining, reset_after, retry_after, time, applied[key])
end
return struct_pack('>ddddd', allowed, remaining, reset_after, retry_after, time)
