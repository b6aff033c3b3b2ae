-- forceunlock.lua: delete a lock whoever holds it and wake its waiters.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the unlock channel
-- KEYS[3]  the line of a FairMutex of the same name, whose first waiter is
--          woken too (see release.lua)
-- ARGV[1]  the publish command: "publish", or "spublish" on Redis Cluster
--
-- Returns 1 when a lock was deleted, 0 when there was none.
if redis.call('del', KEYS[1]) == 1 then
  redis.call(ARGV[1], KEYS[2], 0)
  local head = redis.call('lindex', KEYS[3], 0)
  if head then redis.call(ARGV[1], KEYS[2] .. ':' .. head, 0) end
  return 1
end
return 0
