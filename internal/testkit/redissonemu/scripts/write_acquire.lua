-- write_acquire.lua: an RReadWriteLock write-lock attempt, as the Java
-- client makes it. Only a hash that does not exist can be taken; a
-- re-entry adds the lease to the hash's remaining PTTL.
--
-- KEYS[1]  the hash
-- ARGV[1]  lease (ms)
-- ARGV[2]  the write field "<client id>:<thread id>:write"
--
-- Returns {1} taken or re-entered, {0, pttl} held by someone else.
local mode = redis.call('hget', KEYS[1], 'mode')
if not mode then
  redis.call('hset', KEYS[1], 'mode', 'write', ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {1}
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], redis.call('pttl', KEYS[1]) + tonumber(ARGV[1]))
  return {1}
end
return {0, redis.call('pttl', KEYS[1])}
