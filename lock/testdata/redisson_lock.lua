-- redisson_lock.lua: the script Redisson's RLock (RedissonLock.tryLockInnerAsync)
-- sends to take or re-enter a lock, for tests that play a Java service.
--
-- KEYS[1]  the lock hash
-- ARGV[1]  lease in milliseconds (the lock watchdog timeout, 30000 by default)
-- ARGV[2]  the owner field "<connection manager id>:<thread id>"
--
-- Returns nil when taken or re-entered, else the lock's PTTL.
if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then
  redis.call('hincrby', KEYS[1], ARGV[2], 1);
  redis.call('pexpire', KEYS[1], ARGV[1]);
  return nil;
end;
return redis.call('pttl', KEYS[1]);
