-- The library functions the scripts call per check, as locals: a global's
-- is two table lookups at every call, a local's none. (A function library
-- declares these names at load and sets them at each call: `redis` and
-- `struct` exist only in a call. Each line is `local names = values`.)
local redis_call, redis_pcall = redis.call, redis.pcall
local struct_pack, struct_unpack, string_byte = struct.pack, struct.unpack, string.byte
