
-- fixed_window: a counter that starts at a key's first call and ends `period`
-- later (the seeds' INCR + PEXPIRE counter, made atomic: a refused call writes
-- nothing). Mirrors src/algorithm/fixed_window.rs.
--
-- key  the counter: header "rl\1F" .. (used, ends) packed (ends in µs of
--      the server clock)
local FIXED_WINDOW = header(1, 'F')
local function fixed_window(key, now, slack, count, burst, period, cost)
    local used, ends = load(key, FIXED_WINDOW, 2)
    if not used or now >= ends then used, ends = 0, now + period end

    local reset = ends - now
    if used + cost > count then
        return 0, math.max(count - used, 0), reset, reset
    end
    if used == 0 then
        -- A new window: the key lives exactly as long as it (+ slack when
        -- the caller fixes the time).
        write('SET', key, FIXED_WINDOW .. struct_pack('>dd', cost, ends),
            'PX', text(math.ceil(reset / 1000) + slack))
    else
        -- The same window: only the count changes, in place. The state was
        -- ours (its header said so), written with its TTL, which stays.
        write('SETRANGE', key, '4', struct_pack('>d', used + cost))
    end
    used = used + cost
    local remaining = count - used
    local retry = 0
    if remaining < cost then retry = reset end
    return 1, remaining, reset, retry
end

-- Gives back `units` of the window the charge was counted in (its end is
-- the stamp), if that window is still the key's (never below none used):
-- in place, the TTL stays.
local function fixed_window_refund(key, now, slack, count, burst, period, units, stamp)
    local used, ends = load(key, FIXED_WINDOW, 2)
    if not used or now >= ends or used == 0 or ends ~= tonumber(stamp) then return end
    write('SETRANGE', key, '4', struct_pack('>d', math.max(used - units, 0)))
end
