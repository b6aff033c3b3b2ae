-- release.lua: release one level of a reentrant lock; on the last level delete
-- the lock and publish Redisson's unlock message so that waiters wake up.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the unlock channel "redisson_lock__channel:{<name>}", Redisson's
--          RLock's; the first waiter in the line of a FairMutex of the same
--          name (a Mutex and a FairMutex of one name exclude each other)
--          listens on it too (see lineWake in lines.go)
-- ARGV[1]  the owner field
-- ARGV[2]  the hold count the owner believes it has before this call
-- ARGV[3]  the publish command: "publish", or "spublish" on Redis Cluster
--
-- The owner's count makes resent calls harmless: a copy whose twin was already
-- applied (its reply lost) finds the stored count one lower and changes
-- nothing. The last level removes the owner whatever the stored count, so a
-- re-entry whose reply was lost can never keep the lock held forever.
--
-- A release that leaves levels held does not touch the expiry (Redisson's
-- resets it): the watchdog renews a watchdog hold, and a fixed lease keeps
-- the deadline its holder's context was given.
--
-- Returns the hold count left (0 = the lock is free now), or
--         -1 when the owner does not hold the lock: it expired, was
--            force-unlocked, or a copy of this call already released it.
local expected = tonumber(ARGV[2])

if expected <= 1 then
  -- The last level. The owner's field is the only one of an exclusive
  -- lock's hash: HDEL tells whether it holds and, emptying the hash,
  -- deletes the key, in one command.
  if redis.call('hdel', KEYS[1], ARGV[1]) == 0 then
    return -1
  end
  redis.call(ARGV[3], KEYS[2], 0) -- the waiters: the lock is free
  return 0
end

local held = tonumber(redis.call('hget', KEYS[1], ARGV[1]) or 0)
if held == 0 then
  return -1
end

if expected > 1 and held == expected - 1 then
  -- Applied before; only its reply was lost.
  return held
end

if held <= 1 then
  redis.call('del', KEYS[1])
  redis.call(ARGV[3], KEYS[2], 0) -- the waiters: the lock is free
  return 0
end
return redis.call('hincrby', KEYS[1], ARGV[1], -1)
