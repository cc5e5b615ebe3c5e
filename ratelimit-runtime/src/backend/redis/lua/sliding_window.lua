
-- sliding_window: the two-counter approximation of a sliding window. Windows
-- are aligned to the server clock; the previous window's count is weighted by
-- how much of it still overlaps. O(1) memory. Mirrors
-- src/algorithm/sliding_window.rs.
--
-- key  header "rl\2W" .. (start, cur, prev, born) packed: the start of the
--      current window (µs), its count and the previous one's, and when the
--      counting began (the first call since there was no state: a refund
--      of a charge made before it, a reset between, gives nothing back).
--      Version 1 had no `born`.

-- `a` times `b` in three limbs of 2^23 (low first), for `a` below 2^30 and
-- `b` below 2^46: every partial product is below 2^53, so exact.
local LIMB = 8388608
local function limbs(a, b)
    local a1, b1 = math.floor(a / LIMB), math.floor(b / LIMB)
    local a0, b0 = a - a1 * LIMB, b - b1 * LIMB
    local l0, l1, l2 = a0 * b0, a1 * b0 + a0 * b1, a1 * b1
    local carry = math.floor(l0 / LIMB)
    l0, l1 = l0 - carry * LIMB, l1 + carry
    carry = math.floor(l1 / LIMB)
    return l0, l1 - carry * LIMB, l2 + carry
end
-- Whether a * b <= c * d (as above).
local function product_at_most(a, b, c, d)
    local x0, x1, x2 = limbs(a, b)
    local y0, y1, y2 = limbs(c, d)
    if x2 ~= y2 then return x2 < y2 end
    if x1 ~= y1 then return x1 < y1 end
    return x0 <= y0
end
-- floor(n * span / period), exactly: the previous window's weight. Below
-- 2^53 the product is exact and idiv rounds it right; past that (a large
-- count over a long period) a double quotient can be one off, and is
-- put right by comparing exact products.
local function weighted(n, span, period)
    local product = n * span
    if product < 9007199254740992 then return idiv(product, period) end
    local q = math.floor(product / period)
    while q > 0 and not product_at_most(q, period, n, span) do q = q - 1 end
    while product_at_most(q + 1, period, n, span) do q = q + 1 end
    return q
end
-- The first offset e in [0, period] into a window at which a previous window
-- holding n weighs at most `at_most`.
local function first_offset(n, at_most, period)
    local guess = period - (at_most + 1) * period / n
    local e = 0
    if guess >= 0 then e = math.min(math.floor(guess) + 1, period) end
    while e < period and weighted(n, period - e, period) > at_most do e = e + 1 end
    while e > 0 and weighted(n, period - (e - 1), period) <= at_most do e = e - 1 end
    return e
end

local SLIDING_WINDOW, SLIDING_WINDOW_V1 = header(2, 'W'), header(1, 'W')
-- The key's state: start, cur, prev, born (a version 1 state's counting is
-- taken to begin now).
local function sliding_window_state(key, now)
    local stored = take_pending(key)
    local s, c, p, born = parse(stored, SLIDING_WINDOW, 4)
    if s then return s, c, p, born end
    s, c, p = parse(stored, SLIDING_WINDOW_V1, 3)
    return s, c, p, now
end

local function sliding_window(key, now, slack, count, burst, period, cost)
    -- math.fmod is exact here; Lua's % (a - floor(a/b)*b) can be off for 16-digit numbers.
    local start = now - math.fmod(now, period)
    local cur, prev, born = 0, 0, now
    local s, c, p, b = sliding_window_state(key, now)
    if s then
        if s + period == start then
            prev, born = c, b
        elseif s == start then
            cur, prev, born = c, p, b
        end
    end

    local elapsed = now - start
    local used = cur + weighted(prev, period - elapsed, period)
    local allowed = 0
    if used + cost <= count then
        allowed = 1
        cur, used = cur + cost, used + cost
        -- Worth keeping until this window's count has faded: the end of the next one.
        write('SET', key, SLIDING_WINDOW .. struct_pack('>dddd', start, cur, prev, born),
            'PX', text(math.ceil((2 * period - elapsed) / 1000) + slack))
    end

    local remaining = math.max(count - used, 0)
    local reset = 0
    if cur > 0 then
        reset = 2 * period - elapsed
    elseif prev > 0 then
        reset = period - elapsed
    end
    local retry = 0
    if remaining < cost then
        if cur + cost <= count then
            retry = first_offset(prev, count - cost - cur, period) - elapsed
        else
            retry = period - elapsed + first_offset(cur, count - cost, period)
        end
    end
    return allowed, remaining, reset, retry
end

-- Gives back `units` of the window the charge at `stamp` (µs) was counted
-- in, where it still counts: the current window's count or the previous
-- one's (never below none); not in a state begun after the charge. The TTL
-- stays.
local function sliding_window_refund(key, now, slack, count, burst, period, units, stamp)
    stamp = tonumber(stamp)
    local start = now - math.fmod(now, period)
    local charged = stamp - math.fmod(stamp, period)
    local s, c, p, born = sliding_window_state(key, now)
    if not s or born > stamp or stamp > now then return end
    if charged == s and (s == start or s + period == start) then
        c = math.max(c - units, 0)
    elseif charged + period == s and s == start then
        p = math.max(p - units, 0)
    else
        return
    end
    write('SET', key, SLIDING_WINDOW .. struct_pack('>dddd', s, c, p, born), 'KEEPTTL')
end
