
-- gcra: the generic cell rate algorithm (leaky bucket as a meter): one
-- theoretical arrival time per key. Emission interval period/count µs, burst
-- tolerance burst * period/count. The TAT is kept exactly, as whole µs plus a
-- remainder in 1/count µs, so retry_after is exact. Mirrors
-- src/algorithm/gcra.rs.
--
-- key  header "rl\2G" .. (tat, rem, born) packed: `born`, when the bucket
--      last started from empty (no key, or a TAT reached: a refund of a
--      charge made before it gives nothing back). Version 1 had no `born`.
local GCRA, GCRA_V1 = header(2, 'G'), header(1, 'G')
-- The key's TAT, its remainder and when the bucket began (a version 1
-- state's is taken to be now); nil when it has none.
local function gcra_state(key, now)
    local stored = take_pending(key)
    local tat, rem, born = parse(stored, GCRA, 3)
    if tat then return tat, rem, born end
    tat, rem = parse(stored, GCRA_V1, 2)
    return tat, rem, now
end

local function gcra(key, now, slack, count, burst, period, cost)
    local tolerance = burst * period
    local step = cost * period
    -- How far the TAT is ahead of now, in 1/count µs; a TAT reached is an
    -- empty bucket, where a new one begins.
    local ahead = 0
    local tat, rem, born = gcra_state(key, now)
    if not (tat and (tat > now or (tat == now and rem > 0))) then
        born = now
    else
        local whole = tat - now
        if whole > idiv(tolerance, count) + 1 then
            -- Further ahead than the tolerance allows (a rule whose count was
            -- raised since): refused, worked out without whole * count, which
            -- may be past 2^53 where doubles are no longer exact.
            return 0, 0, whole + ceil_div(rem, count),
                whole + ceil_div(rem + step - tolerance, count)
        end
        ahead = whole * count + rem
    end

    local allowed = 0
    if ahead + step <= tolerance then
        allowed = 1
        ahead = ahead + step
        local whole = idiv(ahead, count)
        -- Once the TAT has passed the key is the same as no key: expire then.
        write('SET', key, GCRA .. struct_pack('>ddd', now + whole, ahead - whole * count, born),
            'PX', text(math.ceil(ceil_div(ahead, count) / 1000) + slack))
    end

    local retry = 0
    if tolerance - ahead < step then retry = ceil_div(ahead + step - tolerance, count) end
    -- ahead can exceed the tolerance only if the rule was tightened since it was stored.
    return allowed, idiv(math.max(tolerance - ahead, 0), period), ceil_div(ahead, count), retry
end

-- Moves the theoretical arrival time back by `units` emission intervals,
-- never before now (a TAT passed is no key), if the charge at `stamp` was
-- counted in this bucket, not one begun since. A TAT further ahead than the
-- rule's tolerance (its count was raised since) is left as it is.
local function gcra_refund(key, now, slack, count, burst, period, units, stamp)
    local tat, rem, born = gcra_state(key, now)
    if not tat or tat < now or born > tonumber(stamp) then return end
    local whole = tat - now
    if whole > idiv(burst * period, count) + 1 then return end
    local ahead = whole * count + rem - units * period
    if ahead <= 0 then
        write('DEL', key)
        return
    end
    local w = idiv(ahead, count)
    write('SET', key, GCRA .. struct_pack('>ddd', now + w, ahead - w * count, born),
        'PX', text(math.ceil(ceil_div(ahead, count) / 1000) + slack))
end

-- How far the TAT is ahead of now (1/count µs) and when the bucket began;
-- nil for no key, or a TAT further ahead than any reservation leaves it.
local function gcra_ahead(key, now, count, burst, period)
    local tat, rem, born = gcra_state(key, now)
    if not tat then return nil end
    if not (tat > now or (tat == now and rem > 0)) then return 0, born end
    local whole = tat - now
    if whole > idiv(burst * period, count) + wait_cap(count) + 2 then return nil end
    return whole * count + rem, born
end

local function gcra_write(key, now, slack, count, ahead, born)
    local whole = idiv(ahead, count)
    write('SET', key, GCRA .. struct_pack('>ddd', now + whole, ahead - whole * count, born),
        'PX', text(math.ceil(ceil_div(ahead, count) / 1000) + slack))
end

-- A call that may wait up to `id` µs: a check, but one the check refuses
-- that can go within the wait moves the TAT on as if it went then, and
-- answers allowed, its position (the TAT's lead, 1/count µs) as
-- `remaining` and its wait as `retry_after` (src/algorithm/mod.rs,
-- `reserve`).
local function gcra_reserve(key, now, slack, count, burst, period, cost, id)
    local allowed, remaining, reset_after, retry = gcra(key, now, slack, count, burst, period, cost)
    if allowed == 1 then return 1, remaining, reset_after, 0 end
    if retry > math.min(tonumber(id), wait_cap(count)) then
        return allowed, remaining, reset_after, retry
    end
    local ahead, born = gcra_ahead(key, now, count, burst, period)
    if not ahead then return allowed, remaining, reset_after, retry end
    local position = ahead + cost * period
    gcra_write(key, now, slack, count, position, born)
    return 1, position, ceil_div(position, count), retry
end

-- Gives back a reservation ("<at>:<position>") not yet due.
local function gcra_cancel(key, now, slack, count, burst, period, cost, id)
    local at, position = reservation(id)
    local ahead, born = gcra_ahead(key, now, count, burst, period)
    if not ahead then return end
    local back = given_back(count, burst, period, now, cost, at, position, ahead, born)
    if not back then return end
    ahead = ahead - math.min(back, ahead)
    if ahead <= 0 then
        write('DEL', key)
        return
    end
    gcra_write(key, now, slack, count, ahead, born)
end
