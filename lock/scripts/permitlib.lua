-- permitlib.lua: put in front of the Semaphore scripts. A Semaphore keeps
-- Redisson's RPermitExpirableSemaphore layout with its meaning:
--
-- KEYS[1]  the counter of free permits: a string named after the semaphore.
--          One that Redisson's trySetPermits made has no expiry and is never
--          given one here. One that this package made (the name had none)
--          expires when idle: its expiry is kept at least one lease past the
--          end of the latest lease of a permit of ours (see keep), so that
--          names made per request leave nothing behind.
-- KEYS[2]  the permits handed out, "{<name>}:timeout": a sorted set, permit
--          -> when its lease ends, in ms. Ours are "<clientUUID>:<ownerID>"
--          on the server's clock; Redisson's are 16 random bytes on its
--          client's clock, and 922337203685477 for a permit without a lease.
--          It keeps the counter's expiry, as Redisson's acquisition sets it.
-- KEYS[3]  the channel "redisson_sc:{<name>}": after a release or a
--          reclaim, the number of free permits, which is how many of its
--          waiters a Redisson client lets try.

-- The score of a Redisson permit without a lease.
local never = 922337203685477

-- reclaim gives the permits whose lease ended by now back to the counter
-- (at most 1000 at a time) and announces the free count when it is
-- positive. With no counter (it expired or was deleted) the dead permits
-- only leave the set: the next acquisition counts the live ones.
local function reclaim(now, publish)
  local gone = redis.call('zrangebyscore', KEYS[2], '-inf', now, 'limit', 0, 1000)
  if #gone == 0 then return end
  redis.call('zrem', KEYS[2], unpack(gone))
  if redis.call('exists', KEYS[1]) == 0 then return end
  local free = redis.call('incrby', KEYS[1], #gone)
  if free > 0 then redis.call(publish, KEYS[3], free) end
end

-- keep makes a counter of ours (one with an expiry) and the permits' set
-- last at least ms from now. A counter without an expiry keeps none.
local function keep(ms)
  local ttl = redis.call('pttl', KEYS[1])
  if ttl < 0 then return end
  if ttl < ms then
    redis.call('pexpire', KEYS[1], ms)
    ttl = ms
  end
  if redis.call('pttl', KEYS[2]) ~= -2 then
    redis.call('pexpire', KEYS[2], ttl)
  end
end
