-- lock_release.lua: an RLock unlock. The last level frees the hash and sends
-- the unlock message on the lock's channel.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the channel "redisson_lock__channel:{<name>}"
-- ARGV[1]  the owner field
-- ARGV[2]  lease (ms) the remaining levels keep
-- ARGV[3]  the unlock message ("0")
-- ARGV[4]  the publish command
--
-- Returns -1 not held by this owner, 0 still held, 1 freed.
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return -1
end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('del', KEYS[1])
redis.call(ARGV[4], KEYS[2], ARGV[3])
return 1
