
-- token_bucket: `burst` tokens, refilled continuously at `count` per `period`,
-- starting full (seed 004, with one key instead of two and the server's clock
-- instead of the caller's). Tokens are fixed point, `period` units per token,
-- so a microsecond refills exactly `count` units and nothing is rounded; every
-- number stays below 2^53. Mirrors src/algorithm/token_bucket.rs.
--
-- key  header "rl\1T" .. (tokens, last) packed (tokens in fixed point, last update in µs)
local TOKEN_BUCKET = header('T')
local function token_bucket(key, now, slack, count, burst, period, cost)
    local capacity = burst * period
    local tokens, last = load(key, TOKEN_BUCKET, 2)
    if tokens then
        -- Kept under a larger burst, before the rule was changed.
        tokens = math.min(tokens, capacity)
    else
        tokens, last = capacity, now
    end

    local elapsed = math.max(now - last, 0)
    if elapsed >= ceil_div(capacity - tokens, count) then
        tokens = capacity
    else
        tokens = tokens + elapsed * count
    end

    local need = cost * period
    local allowed = 0
    if tokens >= need then
        allowed = 1
        tokens = tokens - need
        -- Once full again the bucket is the same as no key: expire then.
        write('SET', key, TOKEN_BUCKET .. struct_pack('>dd', tokens, now),
            'PX', text(math.ceil(ceil_div(capacity - tokens, count) / 1000) + slack))
    end

    local retry = 0
    if tokens < need then retry = ceil_div(need - tokens, count) end
    return allowed, idiv(tokens, period), ceil_div(capacity - tokens, count), retry
end

-- Puts `units` tokens back, up to the burst (a full bucket is no key).
local function token_bucket_refund(key, now, slack, count, burst, period, units)
    local capacity = burst * period
    local tokens, last = load(key, TOKEN_BUCKET, 2)
    if not tokens then return end
    tokens = math.min(tokens, capacity)
    local elapsed = math.max(now - last, 0)
    if elapsed >= ceil_div(capacity - tokens, count) then return end
    tokens = math.min(tokens + elapsed * count + units * period, capacity)
    if tokens == capacity then
        write('DEL', key)
        return
    end
    write('SET', key, TOKEN_BUCKET .. struct_pack('>dd', tokens, now),
        'PX', text(math.ceil(ceil_div(capacity - tokens, count) / 1000) + slack))
end
