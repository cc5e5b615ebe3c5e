
-- batch: many checks in one script run, each on its own key, each with its
-- own rule; the server's clock is read once for all of them. Concurrent
-- checks on one connection are coalesced into one of these (see
-- src/backend/redis/batch.rs): one round trip and one script call carry many
-- checks, each still atomic (the whole script is).
--
-- The arguments and the answer are the wire protocol that
-- src/backend/redis/codec.rs encodes and decodes (and documents): KEYS the
-- checks' keys then the releases'; ARGV[1] the distinct rules, packed
-- doubles (op id, count, burst, period, now or -1, leased); ARGV[2] each
-- check's rule number; ARGV[3] the costs (empty: all 1); ARGV[4] how many
-- first checks are read ahead in one MGET (see `pending` in prelude.lua);
-- ARGV[5] the earliest deadline in server time, then each check's (empty:
-- none); ARGV[6] each check's set (one byte: the number of the set of
-- rules it is a member of, 0: alone; empty: no sets); ARGV[7..] the lease
-- ids (and the stamps refunds name). The
-- answer: 4 packed doubles per check (allowed 2: past its deadline, not
-- run; 3: refused by this master, see below), then the server's time (-1:
-- not read).
-- `run`, the algorithms by op id, and `before`, what runs before a look
-- (op ids of peeks: true; of refunds and resets: their functions), are
-- written before this from the registry. A peek, a refund and a reset
-- answer what a check of cost 1 would answer next, without running it.
--
-- With `whole` (set before this runs), the batch is one call under several
-- rules, all or nothing: see below. Without it, a batch may hold sets of
-- rules among its other checks (ARGV[6]): each set is one unit, all or
-- nothing on its own, run as a whole where its first member comes.
--
-- A check's rule is unpacked once per batch, not once per check: most
-- checks of a batch share a few rules.

texts, aboves, applied, dry = {}, {}, {}, false
local packed, order, costs, deadlines = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
local checks, time = #order, nil
local rules = {}
for r = 1, #packed / 48 do
    local what, count, burst, period, now, flags = struct_unpack('>dddddd', packed, 48 * r - 47)
    local leased = flags % 2
    local slack = 3600000
    if now < 0 then
        if not time then
            local t = redis_call('TIME')
            time = tonumber(t[1]) * 1000000 + tonumber(t[2])
        end
        now, slack = time, 0
    end
    rules[r] = {run[what], now, slack, count, burst, period, leased == 1, before[what], (flags - leased) / 2}
end

-- The string states read ahead, in one MGET: the first checks, each of its
-- own key (the client puts a key's later checks after them).
local values, reads = {}, tonumber(ARGV[4])
if spread then
    -- Keys of several slots (node.lua): an MGET may not span them, so each
    -- is read alone; and every key is read before any is written, so that
    -- one this master does not serve (the client's slot map was out of
    -- date; a slot being migrated) stops the batch before it counted
    -- anything. A script runs whole, so no slot moves after these reads.
    -- The answer -2 alone says so; the client sends each call again alone.
    for i = 1, #KEYS do
        local value = redis_pcall(i <= reads and 'GET' or 'EXISTS', KEYS[i])
        if type(value) == 'table' and value.err
            and not string.find(value.err, 'WRONGTYPE', 1, true) then
            return struct_pack('>d', -2)
        end
        if i <= reads then values[i] = type(value) == 'string' and value end
    end
elseif reads > 0 then
    values = redis_call('MGET', unpack(KEYS, 1, reads))
end

-- Most batches hold checks of one rule: then no check looks its rule up,
-- and its numbers stay in locals.
-- Deadlines: the earliest first, then each check's; a batch in time (the
-- earliest not passed) looks at none of them.
local only, costed = #rules == 1, #costs > 0
local dated = #deadlines > 0 and time and struct_unpack('>d', deadlines, 1) < time
local check, now, slack, count, burst, period, leased, first, limits = unpack(rules[1] or {})
local out, lease, cost = {}, 6, 1
if whole then
    -- One call under several rules: every check runs dry first (it reads
    -- its key, writes nothing) and only if every one allows the call do
    -- they run again and write. Past its deadline, none runs.
    if dated then
        for n = 1, 4 * checks do out[n] = 0 end
        for i = 1, checks do out[4 * i - 3] = 2 end
        out[4 * checks + 1] = time
        return answer(out, checks, KEYS)
    end
    local refused = false
    dry = true
    for i = 1, checks do
        local id = nil
        check, now, slack, count, burst, period, leased, first, limits =
            unpack(rules[string_byte(order, i)])
        if costed then cost = struct_unpack('>d', costs, 8 * i - 7) end
        if leased then
            lease = lease + 1
            id = ARGV[lease]
        end
        pending = values[i]
        local n = 4 * i
        out[n - 3], out[n - 2], out[n - 1], out[n] =
            step(check, first, KEYS[i], now, slack, count, burst, period, cost, id, limits)
        if out[n - 3] ~= 1 then refused = true end
    end
    dry, pending = false, nil
    if refused then
        out[4 * checks + 1] = time or -1
        return answer(out, checks, KEYS)
    end
    lease, out, cost = 6, {}, 1
    check, now, slack, count, burst, period, leased, first, limits = unpack(rules[1] or {})
end
-- Sets of rules among the checks (ARGV[6]): each set's members, by their
-- place; the members already run; the keys a set wrote (a value read ahead
-- for a later check of one is out of date: it is read again); each
-- member's lease id.
local sets = ARGV[6] or ''
local members, done, touched, ids
local function member(m)
    local run_it, at, sl, ct, bu, pe, _, fi, li = unpack(rules[string_byte(order, m)])
    local cs = costed and struct_unpack('>d', costs, 8 * m - 7) or 1
    if m <= reads and not touched[KEYS[m]] then pending = values[m] else pending = nil end
    return step(run_it, fi, KEYS[m], at, sl, ct, bu, pe, cs, ids[m], li)
end
-- One set, all or nothing: every member runs dry (reads its key, writes
-- nothing), and only if every one allows the call do they run again and
-- write. Past its deadline (one for the set), none runs.
local function run_set(set)
    local n = #set
    for k = 1, n do done[set[k]] = true end
    if dated and struct_unpack('>d', deadlines, 8 * set[1] + 1) < time then
        for k = 1, n do
            local j = 4 * set[k]
            out[j - 3], out[j - 2], out[j - 1], out[j] = 2, 0, 0, 0
        end
        return
    end
    local refused = false
    dry = true
    for k = 1, n do
        local j = 4 * set[k]
        out[j - 3], out[j - 2], out[j - 1], out[j] = member(set[k])
        if out[j - 3] ~= 1 then refused = true end
    end
    dry, pending = false, nil
    if refused then return end
    for k = 1, n do
        local m = set[k]
        local j = 4 * m
        if spread then
            -- A write this master refuses (see below): the client gives
            -- back what the set's other members took.
            local ok, a, b, c, d = pcall(member, m)
            if ok then
                out[j - 3], out[j - 2], out[j - 1], out[j] = a, b, c, d
            else
                out[j - 3], out[j - 2], out[j - 1], out[j] = 3, 0, 0, 0
                dry, pending = false, nil
            end
        else
            out[j - 3], out[j - 2], out[j - 1], out[j] = member(m)
        end
        touched[KEYS[m]] = true
    end
end
if not whole and #sets > 0 then
    members, done, touched, ids = {}, {}, {}, {}
    local at = 6
    for i = 1, checks do
        local s = string_byte(sets, i)
        if s > 0 then
            local set = members[s]
            if not set then
                set = {}
                members[s] = set
            end
            set[#set + 1] = i
        end
        if rules[string_byte(order, i)][7] then
            at = at + 1
            ids[i] = ARGV[at]
        end
    end
end
for i = 1, checks do
    local id = nil
    if not only then
        check, now, slack, count, burst, period, leased, first, limits =
            unpack(rules[string_byte(order, i)])
    end
    if costed then cost = struct_unpack('>d', costs, 8 * i - 7) end
    if leased then
        lease = lease + 1
        id = ARGV[lease]
    end
    local n = 4 * i
    if members and string_byte(sets, i) > 0 then
        if not done[i] then run_set(members[string_byte(sets, i)]) end
    elseif dated and struct_unpack('>d', deadlines, 8 * i + 1) < time then
        -- Its caller has stopped waiting: counting it would be a phantom.
        out[n - 3], out[n - 2], out[n - 1], out[n] = 2, 0, 0, 0
    elseif spread then
        -- Keys of several slots: a write this master refuses (a key of a
        -- migrating slot made anew) fails its own check alone, which the
        -- client sends again by itself, not the checks that ran.
        pending = values[i]
        if touched and touched[KEYS[i]] then pending = nil end
        local ok, a, b, c, d =
            pcall(step, check, first, KEYS[i], now, slack, count, burst, period, cost, id, limits)
        if ok then
            out[n - 3], out[n - 2], out[n - 1], out[n] = a, b, c, d
        else
            out[n - 3], out[n - 2], out[n - 1], out[n] = 3, 0, 0, 0
            dry, pending = false, nil
        end
    else
        pending = values[i]
        if touched and touched[KEYS[i]] then pending = nil end
        out[n - 3], out[n - 2], out[n - 1], out[n] =
            step(check, first, KEYS[i], now, slack, count, burst, period, cost, id, limits)
    end
end
-- A release needs no time, and its caller no answer.
for i = checks + 1, #KEYS do
    if costed then cost = struct_unpack('>d', costs, 8 * i - 7) end
    lease = lease + 1
    release(KEYS[i], cost, ARGV[lease])
end
-- The answers packed in one call (a call of the struct library costs about
-- as much for one number as for many), then the server's time.
out[4 * checks + 1] = time or -1
return answer(out, checks, KEYS)
