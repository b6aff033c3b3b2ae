-- transfer.lua: hand a reentrant lock from the owner releasing it to a waiter
-- of the same Client in one step, without freeing it in between: a handoff
-- inside one process costs one round trip instead of an unlock, a pub/sub
-- message and an acquire. The lock stays in Redisson's RLock layout; to
-- everyone else it simply stays held.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the token counter
-- ARGV[1]  the releasing owner's field
-- ARGV[2]  the waiter's field
-- ARGV[3]  the waiter's lease in milliseconds, or 0 to keep the lock's expiry
--          (the waiter is renewed by the same watchdog as the releaser)
-- ARGV[4]  the waiter's token when the releasing owner has one reserved
--          (see issue_token in lib.lua), or 0 to issue one here
-- ARGV[5]  how many tokens to reserve when one is issued here
-- ARGV[6]  the token counter's idle expiry in milliseconds, "0" for none,
--          set when a token is issued here (a token of a reserved block
--          leaves the counter as the block's issue left it)
--
-- Returns the waiter's fencing token, or -1 when the releasing owner does
-- not hold the lock (it expired or was force-unlocked). A resent copy whose
-- twin was applied finds the waiter holding and returns its token.
--
-- The waiter's field is added first and the owner's removed second: the
-- hash is never empty in between, so the key and its expiry stay. An
-- exclusive lock's hash has only its owner's field, so HDEL's answer tells
-- whether the releasing owner held it; if not, the waiter's field goes again
-- and nothing has changed.
local token = tonumber(ARGV[4])
local n = tonumber(ARGV[5])
if redis.call('hset', KEYS[1], ARGV[2], 1) == 0 then
  -- The waiter holds already: applied before, only the reply was lost.
  if token > 0 then return token end
  return tonumber(redis.call('get', KEYS[2]) or 0) - (n - 1)
end
if redis.call('hdel', KEYS[1], ARGV[1]) == 0 then
  redis.call('hdel', KEYS[1], ARGV[2])
  return -1
end
local lease = tonumber(ARGV[3])
if lease > 0 then redis.call('pexpire', KEYS[1], lease) end
if token > 0 then return token end
return issue_token(KEYS[2], 0, n, ARGV[6])
