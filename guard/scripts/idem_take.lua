-- idem_take.lua: the first step of an idempotent request on a route that
-- waits for the first request (WaitForFirst), run while holding the key's
-- semaphore permit. Returns the completed record when the key was completed
-- meanwhile; otherwise marks the key in progress (with the request's
-- fingerprint, so that a concurrent request with another payload can be told
-- apart), replacing the marker of an execution whose permit ended, and
-- returns nil.
--
-- KEYS[1]  the record: "c" .. JSON when completed, "p" .. fingerprint ":" nonce while in progress
-- ARGV[1]  this execution's in-progress marker
-- ARGV[2]  its time to live in milliseconds
local v = redis.call('get', KEYS[1])
if v and string.sub(v, 1, 1) == 'c' then
  return v
end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
