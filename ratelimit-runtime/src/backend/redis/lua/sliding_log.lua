-- sliding_log: an exact sliding window over the calls' times (seed 002, as
-- one atomic script). At most `count` units in any interval of length
-- `period`. Mirrors src/algorithm/sliding_log.rs.
--
-- key  a sorted set, one member per call whatever its cost, scored by its
--      time (µs): packed (through, units), `through` the units counted
--      through that call since the set began; and the mark LOG_MARK, scored
--      +inf, which marks the set as ours and, being last, comes with the
--      newest call in one lookup. The units in the window are the newest
--      call's `through` less what was counted before the window's first
--      call (its `through` less its units): a check costs a few O(log n)
--      lookups, never work in proportion to a cost or a count.
--
-- The set is written in place, never deleted and made again, whatever its
-- length: a key made anew while its slot migrates would be refused half way
-- through the script, and what it held lost. (Version 1 kept a short log
-- in a string, moved to a set by deleting it: such a string is read as no
-- log. Its sets, marked with `rl\1S` scored -1, are marked anew in place.)
--
-- Times never go back in a log (a call is scored no earlier than the
-- newest), so `through` grows with the score, and ties of score order by
-- member as by `through` (big-endian doubles of positive numbers sort as
-- the numbers do).
--
-- Calls older than the window are never counted, so they need not be
-- removed at every call: they are trimmed (up to TRIM at once) when a call
-- is refused or its retry time is needed, and at about one call in eight
-- (the time's last bits). The key lives until the end of the period (as
-- the clock aligns them) after its newest call's: its TTL is set by the
-- first call of a period.
local LOG_MARK, LOG_V1_MARK = header(2, 'S'), header(1, 'S')
local TRIM = 1024
-- The most calls a refund rewrites (`REFUND_WALK` in src/algorithm/sliding_log.rs).
local REFUND_WALK = 1024
-- Above every call's score (times are below 2^53), below the mark's.
local LOG_END = '(9007199254740992'

-- The call at rank `rank`: through, units, score.
local function log_call(key, rank)
    local found = redis_call('ZRANGE', key, text(rank), text(rank), 'WITHSCORES')
    local through, units = struct_unpack('>dd', found[1])
    return through, units, tonumber(found[2])
end

-- The first rank in [lo, hi] whose call is counted through at least
-- `want` units (a bisection: `through` grows with the rank).
local function first_through(key, lo, hi, want)
    while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if log_call(key, mid) >= want then hi = mid else lo = mid + 1 end
    end
    return lo
end

-- The key's log: true (ours), nil (no key) or false (anything else); and
-- its newest call: member, through, time.
local function log_newest(key)
    local got = redis_pcall('ZRANGE', key, '-2', '-1', 'WITHSCORES')
    if type(got) ~= 'table' or got.err then return false end
    local n = #got
    if n == 0 then return nil end
    -- The member before the mark.
    local newest = n - 3
    if got[n - 1] ~= LOG_MARK then
        -- Version 1's mark is the lowest member (scored -1): the last one
        -- fetched is the newest call.
        if type(redis_pcall('ZSCORE', key, LOG_V1_MARK)) ~= 'string' then return false end
        write('ZREM', key, LOG_V1_MARK)
        write('ZADD', key, '+inf', LOG_MARK)
        newest = n - 1
    end
    local call = got[newest]
    if not call or #call ~= 16 then return true end
    return true, call, (struct_unpack('>d', call)), tonumber(got[newest + 1])
end

local function sliding_log(key, now, slack, count, burst, period, cost)
    local ours, member, newest, newest_at = log_newest(key)
    -- The units counted before the window's first call (all of them when
    -- none is in the window), and its first call.
    local base, first = newest or 0, nil
    -- (A newest call out of the window leaves none in it.)
    if newest and newest_at + period > now then
        first = redis_call('ZRANGEBYSCORE', key, above(now - period), LOG_END, 'LIMIT', '0', '1')[1]
        if first then
            local through, units = struct_unpack('>dd', first)
            base = through - units
        end
    end
    local held = (newest or 0) - base
    -- Times never go back in a log.
    local t = now
    if newest_at and newest_at > now then t = newest_at end
    local allowed = 0
    if held + cost <= count then
        allowed = 1
        local call = struct_pack('>dd', (newest or 0) + cost, cost)
        if ours then
            write('ZADD', key, text(t), call)
        else
            -- A new log (anything else under the key is replaced).
            if ours == false then write('DEL', key) end
            write('ZADD', key, text(t), call, '+inf', LOG_MARK)
        end
        -- The key lives until the end of the period after t's: set by a
        -- period's first call, made longer by the others if the rule's
        -- period is (an override).
        local ends = idiv(t, period)
        local ttl = math.ceil(((ends + 2) * period - now) / 1000) + slack
        if not newest_at or ends > idiv(newest_at, period) then
            write('PEXPIRE', key, text(ttl))
        else
            outlive(key, ttl)
        end
        held = held + cost
    elseif ours and newest_at then
        -- Kept while its newest call counts, under this rule's period.
        outlive(key, math.ceil(((idiv(newest_at, period) + 2) * period - now) / 1000) + slack)
    end

    local remaining = math.max(count - held, 0)
    local retry = 0
    if newest and (allowed == 0 or remaining < cost or math.fmod(now, 8) == 0) and not dry then
        local gone = redis_call('ZCOUNT', key, '0', text(now - period))
        if gone > 0 then
            write('ZREMRANGEBYRANK', key, '0', text(math.min(gone, TRIM) - 1))
        end
    end
    if remaining < cost then
        -- The oldest `held + cost - count` units must leave the window
        -- first: the first call counted through them, found by bisection
        -- (the call just made, past the ones stored).
        local want = base + held + cost - count
        if want > (newest or 0) then
            retry = t + period - now
        else
            local lo = redis_call('ZRANK', key, first)
            local _, _, at = log_call(key, first_through(key, lo, redis_call('ZRANK', key, member), want))
            retry = at + period - now
        end
    end
    local reset = 0
    if allowed == 1 then
        reset = t + period - now -- the newest call is this one
    elseif held > 0 then
        reset = newest_at + period - now
    end
    return allowed, remaining, reset, retry
end

-- Takes back `units` of the call logged at `stamp` (µs), while it is in the
-- window: the units logged at that time, newest first (calls logged at one
-- time are alike to every decision), never more than there are. The newer
-- calls at that time go, the oldest touched keeps what is left of it, and
-- every later call is counted through that many units fewer: no more than
-- REFUND_WALK calls are rewritten, else nothing is given back.
local function sliding_log_refund(key, now, slack, count, burst, period, units, stamp)
    stamp = tonumber(stamp)
    local _, _, newest = log_newest(key)
    if stamp + period <= now or not newest then return end
    local at = redis_call('ZREVRANGEBYSCORE', key, text(stamp), text(stamp),
        'LIMIT', '0', text(math.min(units, REFUND_WALK + 1)))
    -- The calls at the stamp, newest first, until the units are taken.
    local left, touched, through, has, take = units, 0, 0, 0, 0
    while touched < #at and left > 0 do
        touched = touched + 1
        through, has = struct_unpack('>dd', at[touched])
        take = math.min(has, left)
        left = left - take
    end
    local taken = units - left
    if taken == 0 then return end
    local later = redis_call('ZRANGEBYSCORE', key, '(' .. text(stamp), LOG_END, 'WITHSCORES',
        'LIMIT', '0', text(REFUND_WALK + 1 - touched))
    if touched + #later / 2 > REFUND_WALK then return end
    local gone, added = {}, {}
    for i = 1, touched do gone[i] = at[i] end
    if take < has then
        -- The oldest touched keeps what was not taken of it.
        added[1], added[2] = text(stamp), struct_pack('>dd', through - take, has - take)
    end
    for i = 1, #later, 2 do
        local t, u = struct_unpack('>dd', later[i])
        gone[#gone + 1] = later[i]
        added[#added + 1] = later[i + 1]
        added[#added + 1] = struct_pack('>dd', t - taken, u)
    end
    write('ZREM', key, unpack(gone))
    if #added > 0 then write('ZADD', key, unpack(added)) end
end
