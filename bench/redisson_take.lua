-- redisson_take.lua: the Redisson floor's acquisition. Redisson's reentrant
-- hash and nothing more: free? then HINCRBY and PEXPIRE. No fencing token.
--
-- KEYS[1]  the lock hash
-- ARGV[1]  the owner field; ARGV[2] the lease in milliseconds
-- Returns 1, or 0 when the lock is held.
if redis.call('exists', KEYS[1]) == 1 then
  return 0
end
redis.call('hincrby', KEYS[1], ARGV[1], 1)
redis.call('pexpire', KEYS[1], ARGV[2])
return 1
