
-- token_bucket: `burst` tokens, refilled continuously at `count` per `period`,
-- starting full (seed 004, with one key instead of two and the server's clock
-- instead of the caller's). Tokens are fixed point, `period` units per token,
-- so a microsecond refills exactly `count` units and nothing is rounded; every
-- number stays below 2^53. Mirrors src/algorithm/token_bucket.rs.
--
-- key  header "rl\2T" .. (tokens, last, period, born) packed: the tokens in
--      fixed point under `period` (µs; a rule of another period reads them
--      as whole tokens), the last update (µs), and when the bucket began
--      (it was full, or reset, before: a refund of a charge made before it
--      gives nothing back). Version 1 held (tokens, last) alone, under the
--      rule's period.
local TOKEN_BUCKET, TOKEN_BUCKET_V1 = header(2, 'T'), header(1, 'T')
-- How long before its last update a bucket's beginning is known (2^40 - 1
-- µs, about 12 days, as the memory backend packs it): a bucket that began
-- earlier is taken to have begun then.
local BORN_SPAN = 1099511627775
-- The key's bucket: its tokens under `period`, last update and beginning;
-- nil when it has none.
local function token_bucket_state(key, now, period)
    local stored = take_pending(key)
    local tokens, last, was, born = parse(stored, TOKEN_BUCKET, 4)
    if tokens then
        if was ~= period then tokens = idiv(tokens, was) * period end
        return tokens, last, math.max(born, last - BORN_SPAN)
    end
    tokens, last = parse(stored, TOKEN_BUCKET_V1, 2)
    if tokens then return tokens, last, now end
    return nil
end

local function token_bucket(key, now, slack, count, burst, period, cost)
    local capacity = burst * period
    local tokens, last, born = token_bucket_state(key, now, period)
    if tokens then
        -- Kept under a larger burst, before the rule was changed.
        tokens = math.min(tokens, capacity)
    else
        tokens, last, born = capacity, now, now
    end

    local elapsed = math.max(now - last, 0)
    if elapsed >= ceil_div(capacity - tokens, count) then
        -- Full again: what was taken before is all back, and a bucket begins.
        tokens, born = capacity, now
    else
        tokens = tokens + elapsed * count
    end

    local need = cost * period
    local allowed = 0
    if tokens >= need then
        allowed = 1
        tokens = tokens - need
        -- Once full again the bucket is the same as no key: expire then.
        write('SET', key, TOKEN_BUCKET .. struct_pack('>dddd', tokens, now, period, born),
            'PX', text(math.ceil(ceil_div(capacity - tokens, count) / 1000) + slack))
    end

    local retry = 0
    if tokens < need then retry = ceil_div(need - tokens, count) end
    return allowed, idiv(tokens, period), ceil_div(capacity - tokens, count), retry
end

-- Puts `units` tokens back, up to the burst (a full bucket is no key), if
-- the charge at `stamp` was taken from this bucket, not one begun since.
local function token_bucket_refund(key, now, slack, count, burst, period, units, stamp)
    local capacity = burst * period
    local tokens, last, born = token_bucket_state(key, now, period)
    if not tokens or born > tonumber(stamp) then return end
    tokens = math.min(tokens, capacity)
    local elapsed = math.max(now - last, 0)
    if elapsed >= ceil_div(capacity - tokens, count) then return end
    tokens = math.min(tokens + elapsed * count + units * period, capacity)
    if tokens == capacity then
        write('DEL', key)
        return
    end
    write('SET', key, TOKEN_BUCKET .. struct_pack('>dddd', tokens, now, period, born),
        'PX', text(math.ceil(ceil_div(capacity - tokens, count) / 1000) + slack))
end
