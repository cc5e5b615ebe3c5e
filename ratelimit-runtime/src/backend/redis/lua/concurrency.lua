-- concurrency: at most `count` units in flight. Each call holds a lease (one
-- member whatever its cost) until it is released or `period` passes (its
-- holder is taken for dead). Mirrors src/algorithm/concurrency.rs.
--
-- key  sorted set of leases: member "<id>" (one unit) or "<id>:<units>",
--      scored by when it expires (µs); and two marks, scored at or below 0
--      so that no count, trim or lookup of leases (all scored above 0) sees
--      them: EXTRA, scored minus the units beyond one of the leases that
--      take several (0 when every lease takes one, as most do), and EPOCH,
--      scored minus the time (µs) the key's TTL was last set to end at.
--      EXTRA also marks the set as ours: a key without it holds nothing of
--      ours, and is replaced.
--
-- What is held is the live leases (ZCOUNT, O(log n)) plus EXTRA: a call's
-- work does not grow with its cost. Leases scored up to `now` are dead and
-- never counted. With no lease of several units, they need not be removed
-- at every call: they are trimmed at a refusal and at about one acquire in
-- ten (the lease id's last digit, random). A dead lease of several units
-- takes its extra units with it: while EXTRA is above 0, every acquire
-- trims the dead leases first, so what is held is exact. Either way at most
-- TRIM leases go in one call, the oldest first, whatever has piled up (a
-- dead lease of several units left for a later call still holds its extra
-- units until then; the memory backend counts the same).
--
-- The key lives until the end of the period after the current one: every
-- lease taken in this period expires before then. So the TTL is set only
-- when that end is later than the one set before (at the first acquire of
-- each period, and when an override lengthened the period), which EPOCH
-- tells. An end that is not later (a shortened period) leaves the TTL as
-- it is, so the key lives at least as long as its longest live lease.
local EXTRA, EPOCH = header(1, 'C'), header(1, 'E')
-- How many leases a retry time is looked for among: past them (a cost that
-- waits for more leases than that to end), the time the last lease ends, by
-- when all have. The memory backend does the same.
local LEASE_WALK = 1024
-- The most dead leases one call removes (`TRIM` in src/algorithm/concurrency.rs).
local TRIM = 1024

local function lease_member(lease, cost)
    if cost == 1 then return lease end
    return lease .. ':' .. text(cost)
end
local function lease_units(member)
    return tonumber(string.match(member, ':(%d+)$')) or 1
end

local function concurrency(key, now, slack, count, burst, period, cost, lease)
    local mark = redis_pcall('ZSCORE', key, EXTRA)
    local ours = type(mark) == 'string'
    local extra, trimmed = 0, false
    if ours then
        extra = -tonumber(mark)
        if extra > 0 then
            -- Dead leases of several units give their extra units back.
            local dead = redis_call('ZRANGEBYSCORE', key, '(0', text(now), 'LIMIT', '0', text(TRIM))
            if #dead > 0 then
                for i = 1, #dead do extra = extra - (lease_units(dead[i]) - 1) end
                write('ZREM', key, unpack(dead))
                trimmed = true
            end
        end
    else
        -- Nothing of ours (another algorithm's state, or anything else): a
        -- fresh start, as the memory backend makes.
        write('DEL', key)
    end
    local live = above(now)
    local held = extra
    if ours then held = held + redis_call('ZCOUNT', key, live, '+inf') end
    local allowed = 0
    if held + cost <= count then
        allowed = 1
        local ends = (idiv(now, period) + 2) * period
        -- LT: EPOCH moves only to a later end (a lower score); CH counts
        -- it when it did, so the TTL is set only then.
        local args = {'LT', 'CH', text(now + period), lease_member(lease, cost), text(-ends), EPOCH}
        local changes = 1
        if trimmed then
            -- Fewer extra units than stored: LT would keep the old score.
            write('ZADD', key, text(-(extra + cost - 1)), EXTRA)
        elseif cost > 1 or not ours then
            -- More (or a new mark): LT lets it through, CH counts it.
            args[7], args[8] = text(-(extra + cost - 1)), EXTRA
            changes = 2
        end
        if write('ZADD', key, unpack(args)) ~= changes then
            -- A later end than the key had (or a new key).
            write('PEXPIRE', key, text(math.ceil((ends - now) / 1000) + slack))
        end
        held = held + cost
    elseif trimmed then
        write('ZADD', key, text(-extra), EXTRA)
    end
    if ours and extra == 0 and not dry and (allowed == 0 or string_byte(lease, -1) == 48) then
        local dead = redis_call('ZRANGEBYSCORE', key, '(0', text(now), 'LIMIT', '0', text(TRIM))
        if #dead > 0 then write('ZREM', key, unpack(dead)) end
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
        -- must go first: looked for among the first LEASE_WALK live ones.
        local want, offset = held + cost - count, 0
        while offset < LEASE_WALK and not (retry > 0) do
            local page = redis_call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES',
                'LIMIT', text(offset), '64')
            if #page == 0 then break end
            for i = 1, #page, 2 do
                want = want - lease_units(page[i])
                if want <= 0 then
                    retry = tonumber(page[i + 1]) - now
                    break
                end
            end
            offset = offset + 64
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
    if redis_pcall('ZREM', key, lease_member(lease, cost)) == 1 and cost > 1 then
        redis_call('ZADD', key, 'XX', 'INCR', text(cost - 1), EXTRA)
    end
end
