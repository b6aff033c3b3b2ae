-- fair_release.lua: release one level of a FairMutex; the last level deletes
-- the lock and wakes the first live waiter on its own channel, and a waiter
-- of a Mutex of the same name on the Mutex's channel.
--
-- KEYS[1..6]  see fairlib.lua
-- ARGV[1]     the owner field
-- ARGV[2]     the hold count the owner believes it has before this call
-- ARGV[3]     the publish command: "publish", or "spublish" on Redis Cluster
-- ARGV[4]     the Client's clock (ms), for Redisson's stale heads
--
-- Resent calls are harmless as in release.lua.
--
-- Returns the hold count left (0 = the lock is free now), or -1 when the owner
-- does not hold the lock.
local held = tonumber(redis.call('hget', KEYS[1], ARGV[1]) or 0)
local expected = tonumber(ARGV[2])
local clock = tonumber(ARGV[4])

if held == 0 then
  wake_head(ARGV[3], purge(clock))
  return -1
end
if expected > 1 and held == expected - 1 then
  return held
end
if expected <= 1 or held <= 1 then
  redis.call('del', KEYS[1])
  freed(ARGV[3], purge(clock))
  return 0
end
return redis.call('hincrby', KEYS[1], ARGV[1], -1)
