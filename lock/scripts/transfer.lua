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
-- ARGV[3]  the waiter's lease in milliseconds
--
-- Returns the waiter's new fencing token, or -1 when the releasing owner
-- does not hold the lock (it expired or was force-unlocked). A resent copy
-- whose twin was applied finds the waiter holding and returns its token.
--
-- The releasing owner's field is the hash's only one (the lock is
-- exclusive), so removing it, whatever its count, empties the hash and
-- Redis deletes the key: HDEL checks the owner and frees in one command.
if redis.call('hdel', KEYS[1], ARGV[1]) == 0 then
  if redis.call('hget', KEYS[1], ARGV[2]) == '1' then
    return tonumber(redis.call('get', KEYS[2]) or 0)
  end
  return -1
end
redis.call('hset', KEYS[1], ARGV[2], 1)
redis.call('pexpire', KEYS[1], ARGV[3])
return issue_token(KEYS[2], 0)
