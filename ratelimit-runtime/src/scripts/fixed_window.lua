-- fixed_window: a counter that starts at a key's first call and ends `period`
-- later (the seeds' INCR + PEXPIRE counter, made atomic: a refused call writes
-- nothing). Mirrors fixed_window() in src/algorithm.rs.
--
-- KEYS[1]  the counter: "F:used:ends" (ends in µs of the server clock)
-- ARGV     see prelude.lua
-- Returns  {allowed (1|0), remaining, reset_after (µs), retry_after (µs)}

local used, ends = 0, now + period
local stored = load('F')
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
