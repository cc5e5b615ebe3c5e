
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

-- The tokens at `now` (below zero while reserved calls wait their turn:
-- the last update is then ahead of now), when the bucket began (full
-- again: now), and whether the key holds a bucket.
local function token_bucket_at(key, now, count, burst, period)
    local capacity = burst * period
    local tokens, last, born = token_bucket_state(key, now, period)
    if not tokens then return capacity, now, false end
    -- Kept under a larger burst, before the rule was changed.
    tokens = math.min(tokens, capacity)
    if last > now then return tokens - (last - now) * count, born, true end
    if now - last >= ceil_div(capacity - tokens, count) then
        -- Full again: what was taken before is all back, and a bucket begins.
        return capacity, now, true
    end
    return tokens + (now - last) * count, born, true
end

-- Writes the bucket holding `tokens` at `now`; below zero, its last update
-- is moved ahead to the first µs at which it holds none or more.
local function token_bucket_write(key, tokens, now, slack, count, burst, period, born)
    local last = now
    if tokens < 0 then
        local wait = ceil_div(-tokens, count)
        last, tokens = now + wait, wait * count + tokens
    end
    -- Once full again the bucket is the same as no key: expire then.
    write('SET', key, TOKEN_BUCKET .. struct_pack('>dddd', tokens, last, period, born),
        'PX', text(math.ceil((last - now + ceil_div(burst * period - tokens, count)) / 1000) + slack))
end

local function token_bucket(key, now, slack, count, burst, period, cost)
    local capacity = burst * period
    local tokens, born, exists = token_bucket_at(key, now, count, burst, period)
    local need = cost * period
    local allowed = 0
    if tokens >= need then
        allowed = 1
        tokens = tokens - need
        token_bucket_write(key, tokens, now, slack, count, burst, period, born)
    elseif exists then
        -- Kept until full again at this rule's rate, as a write would.
        outlive(key, math.ceil(ceil_div(capacity - tokens, count) / 1000) + slack)
    end

    local retry = 0
    if tokens < need then retry = ceil_div(need - tokens, count) end
    return allowed, idiv(math.max(tokens, 0), period), ceil_div(capacity - tokens, count), retry
end

-- Puts `units` tokens back, up to the burst (a full bucket is no key), if
-- the charge at `stamp` was taken from this bucket, not one begun since.
local function token_bucket_refund(key, now, slack, count, burst, period, units, stamp)
    local capacity = burst * period
    local tokens, born, exists = token_bucket_at(key, now, count, burst, period)
    if not exists or tokens >= capacity or born > tonumber(stamp) then return end
    tokens = math.min(tokens + units * period, capacity)
    if tokens == capacity then
        write('DEL', key)
        return
    end
    token_bucket_write(key, tokens, now, slack, count, burst, period, born)
end

-- A call that may wait up to `id` µs: a check, but one the check refuses
-- that can go within the wait takes its tokens now, leaving the bucket
-- below zero until it goes, and answers allowed, its position (how far
-- the bucket is short of full) as `remaining` and its wait as
-- `retry_after` (src/algorithm/mod.rs, `reserve`).
local function token_bucket_reserve(key, now, slack, count, burst, period, cost, id)
    local allowed, remaining, reset_after, retry =
        token_bucket(key, now, slack, count, burst, period, cost)
    if allowed == 1 then return 1, remaining, reset_after, 0 end
    if retry > math.min(tonumber(id), wait_cap(count)) then
        return allowed, remaining, reset_after, retry
    end
    local tokens, born, exists = token_bucket_at(key, now, count, burst, period)
    if not exists then return allowed, remaining, reset_after, retry end
    tokens = tokens - cost * period
    token_bucket_write(key, tokens, now, slack, count, burst, period, born)
    local position = burst * period - tokens
    return 1, position, ceil_div(position, count), retry
end

-- Gives back a reservation ("<at>:<position>") not yet due.
local function token_bucket_cancel(key, now, slack, count, burst, period, cost, id)
    local at, position = reservation(id)
    local capacity = burst * period
    local tokens, born, exists = token_bucket_at(key, now, count, burst, period)
    if not exists then return end
    local back = given_back(count, burst, period, now, cost, at, position, capacity - tokens, born)
    if not back then return end
    tokens = tokens + back
    if tokens >= capacity then
        write('DEL', key)
        return
    end
    token_bucket_write(key, tokens, now, slack, count, burst, period, born)
end
