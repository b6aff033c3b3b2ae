-- fair_release.lua: an RFairLock unlock (after fairlib.lua). The message
-- goes to the first waiter's own channel only, not to the lock's channel.
--
-- KEYS[1]  the lock hash, KEYS[2] the line, KEYS[3] the deadlines
-- KEYS[4]  the channel prefix "redisson_lock__channel:{<name>}"; the waiter
--          with field f listens on "<prefix>:<f>"
-- ARGV[1]  the owner field
-- ARGV[2]  lease (ms) the remaining levels keep
-- ARGV[3]  the client's clock (ms)
-- ARGV[4]  the publish command
--
-- Returns -1 not held, 0 still held, 1 freed (also when the lock was gone
-- already).
drop_stale_heads(tonumber(ARGV[3]))

local function tell_first()
  local first = redis.call('lindex', KEYS[2], 0)
  if first then redis.call(ARGV[4], KEYS[4] .. ':' .. first, 0) end
end

if redis.call('exists', KEYS[1]) == 0 then
  tell_first()
  return 1
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return -1
end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('del', KEYS[1])
tell_first()
return 1
