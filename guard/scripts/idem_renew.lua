-- idem_renew.lua: renews an in-progress marker for another lease, only
-- while it is still this execution's own.
--
-- KEYS[1]  the record
-- ARGV[1]  this execution's in-progress marker
-- ARGV[2]  the lease in milliseconds
--
-- Returns 1 when renewed, 0 when the marker is gone or another's.
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
return redis.call('pexpire', KEYS[1], ARGV[2])
