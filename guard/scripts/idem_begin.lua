-- idem_begin.lua: the first step of an idempotent request, its only round
-- trip before the handler. Returns what the key holds — a completed record
-- (replay it), or another execution's in-progress marker (409, or 422 for
-- another fingerprint) — or, when the key is free, marks it in progress for
-- the lease and returns nil. The marker expires with its lease unless the
-- executing instance renews it (idem_renew.lua): a dead instance frees the
-- key by itself.
--
-- KEYS[1]  the record: "c" .. JSON when completed, "p" .. fingerprint ":" nonce while in progress
-- ARGV[1]  this execution's in-progress marker
-- ARGV[2]  the marker's lease in milliseconds
local v = redis.call('get', KEYS[1])
if v then
  return v
end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
