-- lock_acquire.lua: an RLock acquisition attempt, as the Java client makes it.
-- Also the read side's "write" kind uses its own script (write_acquire.lua).
--
-- KEYS[1]  the lock hash: owner field -> hold count
-- ARGV[1]  lease (ms): the lock watchdog timeout, or tryLock's lease
-- ARGV[2]  the owner field "<client id>:<thread id>"
--
-- Returns {1} taken or re-entered, {0, pttl} held by someone else.
local mine = redis.call('hexists', KEYS[1], ARGV[2]) == 1
if not mine and redis.call('exists', KEYS[1]) == 1 then
  return {0, redis.call('pttl', KEYS[1])}
end
redis.call('hincrby', KEYS[1], ARGV[2], 1)
redis.call('pexpire', KEYS[1], ARGV[1])
return {1}
