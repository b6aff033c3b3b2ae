-- write_release.lua: an RReadWriteLock write unlock, as the Java client
-- makes it. The last level leaves the hash to the thread's own read levels
-- (mode read) when it has any, else deletes it and sends "1".
--
-- KEYS[1]  the hash
-- KEYS[2]  the channel "redisson_rwlock:{<name>}"
-- ARGV[1]  the write field
-- ARGV[2]  lease (ms) the remaining levels keep
-- ARGV[3]  the publish command
--
-- Returns -1 not held, 0 still held, 1 released.
local mode = redis.call('hget', KEYS[1], 'mode')
if not mode then
  redis.call(ARGV[3], KEYS[2], 1)
  return -1
end
if mode ~= 'write' or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return -1
end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('hdel', KEYS[1], ARGV[1])
if redis.call('hlen', KEYS[1]) == 1 then
  redis.call('del', KEYS[1])
  redis.call(ARGV[3], KEYS[2], 1)
else
  redis.call('hset', KEYS[1], 'mode', 'read')
end
return 1
