-- renew.lua: the lock watchdog's renewal of one hold of an RLock, RFairLock
-- or write lock: the hash's expiry is set again while the owner's field is
-- in it.
--
-- KEYS[1]  the lock hash
-- ARGV[1]  lease (ms)
-- ARGV[2]  the owner field
--
-- Returns 1 renewed, 0 the hold is gone.
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
  return 0
end
redis.call('pexpire', KEYS[1], ARGV[1])
return 1
