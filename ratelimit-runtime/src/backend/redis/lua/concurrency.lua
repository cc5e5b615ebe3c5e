-- concurrency: at most `count` units in flight. Each call holds a lease (one
-- member per unit, scored by when it expires) until it is released with ZREM
-- or `period` passes (its holder is taken for dead). Mirrors
-- src/algorithm/concurrency.rs.
--
-- key  sorted set of leases: member "lease" (one unit) or "lease:unit",
--      score = expiry (µs); and member "epoch", score = minus the time (µs)
--      the key's TTL was last set to end at
--
-- Leases scored up to `now` are dead and never counted (ZCOUNT counts the
-- live ones), so they need not be removed at every call: they are trimmed
-- at a refusal and at about one acquire in ten (the lease id's last digit,
-- random), which bounds what dead holders leave behind.
--
-- The key lives until the end of the period after the current one: every
-- lease taken in this period expires before then. So the TTL is set only
-- when that end is later than the one set before (at the first acquire of
-- each period, and when an override lengthened the period), which the
-- "epoch" member tells: it is added with the lease, in the same ZADD, with
-- LT (kept unless the new score is lower, i.e. the end later) and CH (the
-- reply counts it when it changed). An end that is not later (a shortened
-- period) leaves the TTL as it is, so the key lives at least as long as
-- its longest live lease. Its score is never above 0, so no count, trim or
-- lookup of leases (all scored above `now`, or in (0, now]) ever sees it.
local function concurrency(key, now, slack, count, burst, period, cost, lease)
    local live = above(now)
    local held = redis_pcall('ZCOUNT', key, live, '+inf')
    if type(held) == 'table' then
        -- Another algorithm's state: a fresh start, as the memory backend makes.
        redis_call('DEL', key)
        held = 0
    end
    local allowed = 0
    if held + cost <= count then
        allowed = 1
        local ends = (idiv(now, period) + 2) * period
        local changed
        if cost == 1 then
            changed = redis_call('ZADD', key, 'LT', 'CH', text(now + period), lease,
                text(-ends), 'epoch')
        else
            add_units(key, cost, now + period, lease, 0)
            changed = 1 + redis_call('ZADD', key, 'LT', 'CH', text(-ends), 'epoch')
        end
        if changed > 1 then
            -- A later end than the key had (or a new key).
            redis_call('PEXPIRE', key, text(math.ceil((ends - now) / 1000) + slack))
        end
        held = held + cost
    end
    if allowed == 0 or string_byte(lease, -1) == 48 then
        redis_call('ZREMRANGEBYSCORE', key, '(0', text(now))
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
        -- must go first.
        retry = tonumber(redis_call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES',
            'LIMIT', text(held + cost - count - 1), '1')[2]) - now
    end
    return allowed, remaining, reset, retry
end

-- Gives back the units of a concurrency lease (the limiter's release). A
-- key that another algorithm's state took over (a rule changed) holds no
-- lease to give back: ZREM's error there is dropped, not raised, so the
-- checks that share the batch still run.
local function release(key, cost, lease)
    if cost == 1 then
        redis_pcall('ZREM', key, lease)
    else
        local members = {}
        for unit = 0, cost - 1 do
            members[#members + 1] = lease .. ':' .. text(unit)
            if #members == 4000 or unit == cost - 1 then
                if type(redis_pcall('ZREM', key, unpack(members))) == 'table' then
                    return
                end
                members = {}
            end
        end
    end
end
