-- fair_acquire.lua: an RFairLock acquisition attempt, as the Java client
-- makes it (after fairlib.lua).
--
-- KEYS[1]  the lock hash, KEYS[2] the line, KEYS[3] the deadlines
-- ARGV[1]  lease (ms)
-- ARGV[2]  the owner field
-- ARGV[3]  this waiter's wait (ms): tryLock's wait time when positive, else
--          the client's fairLockWaitTimeout
-- ARGV[4]  the client's clock (ms since the epoch)
-- ARGV[5]  "once": do not join the line when the lock cannot be had
--          (tryLock() without a wait)
--
-- A free lock goes to the head of the line, or to anyone when nobody
-- waits; the one who takes it leaves the line and lowers every remaining
-- deadline by its own wait. A newcomer's deadline is the deadline of the
-- last waiter (or, when nobody waits, the lock's remaining lease plus now)
-- plus its wait.
--
-- Returns {1} taken or re-entered; {0, ms} wait for a message at most ms
-- (negative: without bound).
local lease, me, wait, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

drop_stale_heads(now)

local head = redis.call('lindex', KEYS[2], 0)
if redis.call('exists', KEYS[1]) == 0 and (not head or head == me) then
  if head then redis.call('lpop', KEYS[2]) end
  redis.call('zrem', KEYS[3], me)
  for _, w in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
    redis.call('zincrby', KEYS[3], -wait, w)
  end
  redis.call('hset', KEYS[1], me, 1)
  redis.call('pexpire', KEYS[1], lease)
  return {1}
end
if redis.call('hexists', KEYS[1], me) == 1 then
  redis.call('hincrby', KEYS[1], me, 1)
  redis.call('pexpire', KEYS[1], lease)
  return {1}
end
if ARGV[5] == 'once' then
  return {0, -1}
end
if redis.call('zscore', KEYS[3], me) then
  -- already in line: wait for a message, or at most the holder's lease
  return {0, math.max(redis.call('pttl', KEYS[1]), 0)}
end
local ahead
local tail = redis.call('lindex', KEYS[2], -1)
local tail_due = tail and tail ~= me and redis.call('zscore', KEYS[3], tail)
if tail_due then
  ahead = tonumber(tail_due) - now
else
  ahead = redis.call('pttl', KEYS[1])
end
if redis.call('zadd', KEYS[3], ahead + wait + now, me) == 1 then
  redis.call('rpush', KEYS[2], me)
end
return {0, ahead}
