-- read_acquire.lua: an RReadWriteLock read-lock attempt, as the Java client
-- makes it. Every read level has a key of its own whose expiry is that
-- level's lease: "<timeout prefix>:<level>".
--
-- KEYS[1]  the hash: "mode" -> read|write, reader field -> levels,
--          "<field>:write" -> the writer's levels
-- KEYS[2]  this reader's timeout prefix "{<name>}:<field>:rwlock_timeout"
-- ARGV[1]  lease (ms)
-- ARGV[2]  the reader's field "<client id>:<thread id>"
-- ARGV[3]  the same thread's write field "<client id>:<thread id>:write"
--
-- A reader gets in when nobody holds the lock, when it is held for reading
-- (a waiting writer does not stop it), or when its own thread holds the
-- write lock. The hash keeps the longer of its expiry and the lease.
--
-- Returns {1} taken, {0, pttl} a writer holds it.
local mode = redis.call('hget', KEYS[1], 'mode')
local lease = tonumber(ARGV[1])
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
  return {0, redis.call('pttl', KEYS[1])}
end
if not mode then
  redis.call('hset', KEYS[1], 'mode', 'read')
end
local level = redis.call('hincrby', KEYS[1], ARGV[2], 1)
redis.call('set', KEYS[2] .. ':' .. level, 1, 'px', lease)
redis.call('pexpire', KEYS[1], math.max(redis.call('pttl', KEYS[1]), lease))
return {1}
