-- fair_leave.lua: a waiter that gives up leaves the FairMutex's queue; if the
-- lock is free, the new first waiter is told to try.
--
-- KEYS[1..4]  see fairlib.lua
-- ARGV[1]     the owner field
-- ARGV[2]     the publish command: "publish", or "spublish" on Redis Cluster
-- ARGV[3]     "1" to also drop a first-level hold of the owner (an
--             acquisition whose reply was lost), "0" not to
--
-- Returns 1 when the owner had a place in the queue, 0 when not.
local had = redis.call('zrem', KEYS[3], ARGV[1])
redis.call('lrem', KEYS[2], 0, ARGV[1])
local dropped = false
if ARGV[3] == '1' and redis.call('hget', KEYS[1], ARGV[1]) == '1' then
  redis.call('del', KEYS[1])
  dropped = true
end
purge()
if dropped then
  freed(ARGV[2])
else
  wake_head(ARGV[2], nil)
end
return had
