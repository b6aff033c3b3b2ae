-- renew.lua: the watchdog's batch renewal. Extends each lock whose owner still
-- holds it; never recreates or extends a lock the owner no longer holds.
--
-- KEYS        the lock hashes, one per lock; all in one hash slot
-- ARGV[1]     lease in milliseconds
-- ARGV[1+i]   the owner field of the i-th lock
--
-- Only holds the watchdog renews come here, and a re-entry never turns a
-- hold's watchdog off (nor shortens its lease), so a renewal that arrives
-- late, or is resent after a lost reply, sets the lease the watchdog would
-- have set anyway: there is no fixed lease it could stretch.
--
-- Returns an array: 1 where the lock is held (renewed), 0 where it is gone.
local lease = ARGV[1]
local out = {}
for i = 1, #KEYS do
  if redis.call('hexists', KEYS[i], ARGV[i + 1]) == 1 then
    redis.call('pexpire', KEYS[i], lease)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
