-- renew.lua: the watchdog's batch renewal. Extends each lock whose owner still
-- holds it; never recreates or extends a lock the owner no longer holds, nor
-- one whose lease the owner has fixed since this call was sent.
--
-- KEYS        for each lock in turn: the lock hash, its fixed-lease mark
--             "seckillguard_fixed_lease:{<name>}"; all in one hash slot
-- ARGV[1]     lease in milliseconds
-- ARGV[1+i]   the owner field of the i-th lock
--
-- A re-entry with WithLease fixes a hold's lease and stops its renewals, but
-- a renewal sent before (or resent by the client library after a lost
-- reply) may still arrive after it: it finds the mark holding the owner's
-- field, which the re-entry set with the same expiry, and leaves the lock's
-- expiry as the re-entry set it.
--
-- Returns an array: 1 where the lock is held (renewed, or its lease fixed),
-- 0 where it is gone.
local lease = ARGV[1]
local out = {}
for i = 1, #KEYS / 2 do
  local lock, me = KEYS[2 * i - 1], ARGV[i + 1]
  if redis.call('hexists', lock, me) == 1 then
    if redis.call('get', KEYS[2 * i]) ~= me then
      redis.call('pexpire', lock, lease)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
