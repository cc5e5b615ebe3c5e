-- concurrency: at most `count` units in flight. Each call holds a lease (one
-- member whatever its cost) until it is released or `period` passes (its
-- holder is taken for dead). Mirrors src/algorithm/concurrency.rs.
--
-- key  sorted set of leases: member "<id>" (one unit) or "<id>:<units>",
--      scored by when it expires (µs); and two marks, scored at or below 0
--      so that no count, trim or lookup of leases (all scored above 0) sees
--      them: LEASES, scored minus the units of the leases in the set (so a
--      check reads what is held in O(1), whatever the costs), and EPOCH,
--      scored minus the time (µs) the key's TTL was last set to end at.
--      LEASES also marks the set as ours: a key without it holds nothing of
--      ours, and is replaced.
--
-- Leases scored up to `now` are dead: at each acquire they are trimmed and
-- their units taken off LEASES, so what is held is exact.
--
-- The key lives until the end of the period after the current one: every
-- lease taken in this period expires before then. So the TTL is set only
-- when that end is later than the one set before (at the first acquire of
-- each period, and when an override lengthened the period), which EPOCH
-- tells. An end that is not later (a shortened period) leaves the TTL as
-- it is, so the key lives at least as long as its longest live lease.
local LEASES, EPOCH = header('C'), header('E')
-- How many leases a retry time is looked for among: past them (a cost that
-- waits for more leases than that to end), the time the last lease ends, by
-- when all have. The memory backend does the same.
local LEASE_WALK = 1024

local function lease_member(lease, cost)
    if cost == 1 then return lease end
    return lease .. ':' .. text(cost)
end
local function lease_units(member)
    return tonumber(string.match(member, ':(%d+)$')) or 1
end

local function concurrency(key, now, slack, count, burst, period, cost, lease)
    local marks = redis_pcall('ZMSCORE', key, LEASES, EPOCH)
    -- Dead leases still stored (a peek does not trim them): first in the set.
    local held, epoch, trimmed, stale = 0, nil, false, 0
    if marks[1] then
        held, epoch = -tonumber(marks[1]), marks[2] and -tonumber(marks[2])
        local dead = redis_call('ZRANGEBYSCORE', key, '(0', text(now))
        if #dead > 0 then
            -- Holders that died: their units come back.
            for i = 1, #dead do held = held - lease_units(dead[i]) end
            write('ZREMRANGEBYSCORE', key, '(0', text(now))
            trimmed = true
            if dry then stale = #dead end
        end
    else
        -- Nothing of ours (another algorithm's state, or anything else): a
        -- fresh start, as the memory backend makes.
        write('DEL', key)
    end
    local allowed = 0
    if held + cost <= count then
        allowed = 1
        local ends = (idiv(now, period) + 2) * period
        local member = lease_member(lease, cost)
        if epoch and epoch >= ends then
            write('ZADD', key, text(now + period), member, text(-(held + cost)), LEASES)
        else
            -- A later end than the key had (or a new key).
            write('ZADD', key, text(now + period), member, text(-(held + cost)), LEASES,
                text(-ends), EPOCH)
            write('PEXPIRE', key, text(math.ceil((ends - now) / 1000) + slack))
        end
        held = held + cost
    elseif trimmed then
        write('ZADD', key, text(-held), LEASES)
    end

    local remaining = math.max(count - held, 0)
    local reset = 0
    if allowed == 1 then
        reset = period -- the newest lease is this one
    elseif held > 0 then
        reset = score_at(key, -1) - now
    end
    local retry = 0
    if remaining < cost then
        -- The live lease holding unit number `held + cost - count` (1-based)
        -- must go first. Live leases are all of the set past its two marks
        -- (and the dead ones a peek left).
        local want, rank = held + cost - count, 2 + stale
        local stop = rank + LEASE_WALK
        while rank < stop and not (retry > 0) do
            local page = redis_call('ZRANGE', key, text(rank), text(rank + 63), 'WITHSCORES')
            if #page == 0 then break end
            for i = 1, #page, 2 do
                want = want - lease_units(page[i])
                if want <= 0 then
                    retry = tonumber(page[i + 1]) - now
                    break
                end
            end
            rank = rank + 64
        end
        if not (retry > 0) then
            -- Past the leases walked: by when the last lease ends (the one
            -- just taken, too, which a peek does not store).
            local last = score_at(key, -1) or 0
            if allowed == 1 then last = math.max(last, now + period) end
            retry = last - now
        end
    end
    return allowed, remaining, reset, retry
end

-- Gives back the units of a concurrency lease (the limiter's release). A
-- lease already trimmed (dead), or a key that another algorithm's state
-- took over (a rule changed), holds nothing to give back: ZREM's error
-- there is dropped, not raised, so the checks that share the batch still
-- run.
local function release(key, cost, lease)
    if redis_pcall('ZREM', key, lease_member(lease, cost)) == 1 then
        redis_call('ZADD', key, 'XX', 'INCR', text(cost), LEASES)
    end
end
