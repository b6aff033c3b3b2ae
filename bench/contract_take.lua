-- contract_take.lua: the contract floor's acquisition. The Redis work this
-- framework's contract requires of a first acquisition and nothing more: Redisson's
-- reentrant hash (free? then HINCRBY and PEXPIRE) and a fencing token,
-- max(stored + 1, TIME in microseconds), stored in the counter.
--
-- KEYS[1]  the lock hash; KEYS[2] the token counter
-- ARGV[1]  the owner field; ARGV[2] the lease in milliseconds
-- Returns the token, or 0 when the lock is held.
if redis.call('exists', KEYS[1]) == 1 then
  return 0
end
redis.call('hincrby', KEYS[1], ARGV[1], 1)
redis.call('pexpire', KEYS[1], ARGV[2])
local t = redis.call('time')
local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
local stored = tonumber(redis.call('set', KEYS[2], string.format('%.0f', token), 'get') or 0)
if stored >= token then
  token = stored + 1
  redis.call('set', KEYS[2], string.format('%.0f', token))
end
return token
