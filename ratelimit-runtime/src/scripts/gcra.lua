-- gcra: the generic cell rate algorithm (leaky bucket as a meter): one
-- theoretical arrival time per key. Emission interval period/count µs, burst
-- tolerance burst * period/count. The TAT is kept exactly, as whole µs plus a
-- remainder in 1/count µs, so retry_after is exact. Mirrors gcra() in
-- src/algorithm.rs.
--
-- KEYS[1]  "G:tat:rem"
-- ARGV     see prelude.lua
-- Returns  {allowed (1|0), remaining, reset_after (µs), retry_after (µs)}

local tolerance = burst * period
-- How far the TAT is ahead of now, in 1/count µs.
local ahead = 0
local stored = load('G')
if stored then
    local tat, rem = stored[1], stored[2]
    if tat >= now then ahead = (tat - now) * count + rem end
end

local step = cost * period
local allowed = 0
if ahead + step <= tolerance then
    allowed = 1
    ahead = ahead + step
    local whole = idiv(ahead, count)
    -- Once the TAT has passed the key is the same as no key: expire then.
    redis.call('SET', KEYS[1], string.format('G:%.0f:%.0f', now + whole, ahead - whole * count),
        'PX', math.ceil(ceil_div(ahead, count) / 1000) + slack)
end

local retry = 0
if tolerance - ahead < step then retry = ceil_div(ahead + step - tolerance, count) end
-- ahead can exceed the tolerance only if the rule was tightened since it was stored.
return {allowed, idiv(math.max(tolerance - ahead, 0), period), ceil_div(ahead, count), retry}
