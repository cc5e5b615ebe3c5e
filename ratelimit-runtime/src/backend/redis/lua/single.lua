
-- single: one check of the algorithm above (`check`), the rule's own script.
--
-- KEYS[1]  the key
-- ARGV     count, burst, period (µs), cost, now (µs; "" = the server's TIME)
--          [, lease id for concurrency]
-- Returns  {allowed (1|0), remaining, reset_after (µs), retry_after (µs)}
texts, aboves = {}, {}
local now, slack = tonumber(ARGV[5]), 3600000
if not now then
    local t = redis_call('TIME')
    now, slack = tonumber(t[1]) * 1000000 + tonumber(t[2]), 0
end
return {check(KEYS[1], now, slack, tonumber(ARGV[1]), tonumber(ARGV[2]),
    tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[6])}
