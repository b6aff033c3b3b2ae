-- contract_release.lua: the release of both reference floors, Redisson's and
-- the contract's. The last level of a Redisson hash: remove the owner (the
-- emptied hash goes with it) and publish the unlock message waiters wake on.
--
-- KEYS[1]  the lock hash; KEYS[2] the unlock channel
-- ARGV[1]  the owner field
-- Returns 1, or 0 when the owner did not hold the lock.
if redis.call('hdel', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('publish', KEYS[2], 0)
return 1
