-- permit_release.lua: give a Semaphore permit back and wake a waiter.
--
-- KEYS[1]  the semaphore's sorted set (see permit_acquire.lua)
-- KEYS[2]  the release channel "redisson_sc:{<name>}"
-- ARGV[1]  the holder member
-- ARGV[2]  the publish command: "publish", or "spublish" on Redis Cluster
--
-- Returns 0 when the permit was given back, -1 when the owner had none (it
-- expired, or a copy of this call gave it back already).
if redis.call('zrem', KEYS[1], ARGV[1]) == 0 then
  return -1
end
redis.call(ARGV[2], KEYS[2], 0)
return 0
