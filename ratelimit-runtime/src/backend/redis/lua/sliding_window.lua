
-- sliding_window: the two-counter approximation of a sliding window. Windows
-- are aligned to the server clock; the previous window's count is weighted by
-- how much of it still overlaps. O(1) memory. Mirrors
-- src/algorithm/sliding_window.rs, including its double arithmetic (so both
-- round alike).
--
-- key  header "rl\1W" .. (start, cur, prev) packed (start of the current window in µs)

local function weighted(n, span, period)
    return math.floor(n * span / period)
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

local SLIDING_WINDOW = header('W')
local function sliding_window(key, now, slack, count, burst, period, cost)
    -- math.fmod is exact here; Lua's % (a - floor(a/b)*b) can be off for 16-digit numbers.
    local start = now - math.fmod(now, period)
    local cur, prev = 0, 0
    local s, c, p = load(key, SLIDING_WINDOW, 3)
    if s then
        if s + period == start then
            prev = c
        elseif s == start then
            cur, prev = c, p
        end
    end

    local elapsed = now - start
    local used = cur + weighted(prev, period - elapsed, period)
    local allowed = 0
    if used + cost <= count then
        allowed = 1
        cur, used = cur + cost, used + cost
        -- Worth keeping until this window's count has faded: the end of the next one.
        write('SET', key, SLIDING_WINDOW .. struct_pack('>ddd', start, cur, prev),
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

-- Gives back `units` of the current window's count (never below none).
local function sliding_window_refund(key, now, slack, count, burst, period, units)
    local start = now - math.fmod(now, period)
    local s, c, p = load(key, SLIDING_WINDOW, 3)
    if s ~= start or c == 0 then return end
    write('SET', key, SLIDING_WINDOW .. struct_pack('>ddd', s, math.max(c - units, 0), p),
        'PX', text(math.ceil((2 * period - (now - start)) / 1000) + slack))
end
