-- node: a batch whose keys are of several slots that one Redis Cluster
-- master serves (src/backend/redis/nodes.rs groups them by the slot map the
-- cluster last gave). A call's declared keys must share a slot, so these
-- come as arguments: ARGV[1] how many, the keys, then the batch's own
-- arguments (batch.lua). Registered with the flag allow-cross-slot-keys;
-- batch.lua reads every key before it writes any (see `spread`).
local n = tonumber(ARGV[1])
KEYS, ARGV = {unpack(ARGV, 2, n + 1)}, {unpack(ARGV, n + 2)}
spread = true
