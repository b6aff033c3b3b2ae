-- renew.lua: the watchdog's batch renewal. Extends each lock whose owner still
-- holds it; never recreates or extends a lock the owner no longer holds.
--
-- KEYS[1..n]  lock hashes, all in one hash slot
-- ARGV[1]     lease in milliseconds
-- ARGV[1+i]   the owner field for KEYS[i]
--
-- Returns an array: 1 where the lock was renewed, 0 where it is gone.
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
