-- fair_acquire.lua: take or re-enter a FairMutex, or keep a place in its
-- line. The lock hash and the token are the Mutex's (acquire.lua); the line
-- is Redisson's RFairLock line (see fairlib.lua), which decides who may take
-- a free lock: the first waiter, or anyone when nobody waits.
--
-- KEYS[1..5]  see fairlib.lua
-- KEYS[6]     the token counter "redisson_lock_token:{<name>}"
-- ARGV[1]     lease in milliseconds; a re-entry only extends the expiry to it,
--             never shortens it (0 = keep the expiry: re-entry of a fixed lease)
-- ARGV[2]     the owner field
-- ARGV[3]     the hold count the owner believes it has before this call (0 for
--             a first acquisition); makes resent calls harmless, as in acquire.lua
-- ARGV[4]     the waiter's wait (ms), as Redisson counts it: TryLock's wait
--             when positive, else the Client's fair lock wait timeout
-- ARGV[5]     the Client's clock (ms since the epoch): Redisson's deadlines
--             are on its clients' clocks
-- ARGV[6]     how long a place in the line lasts without a sign of life (ms)
-- ARGV[7]     the publish command: "publish", or "spublish" on Redis Cluster
-- ARGV[8]     the token counter's idle expiry in milliseconds, "0" for none
--
-- The first waiter that acquires tells the next one, on its channel, the
-- lease it took ("-<ms>"): that one tries again when the lease ends at the
-- latest. Redisson's waiters act on "0" and "1" only.
--
-- Returns {1, token}  acquired (token 0 on a re-entry: the owner keeps its own)
--         {0, wait}   queued behind others; wait is how long to wait for a
--                     wake-up at most (ms): until the holder's lease ends or
--                     a waiter ahead must show it is alive
--         {2, pttl}   queued first in line: the holder's PTTL (-1: no
--                     expiry); the waiter then acts on a Mutex's unlock
--                     message too (see lineWake in queue.go)
--         {3, wait}   queued behind a foreign waiter (no liveness entry of
--                     ours) who is first while the lock is free; wait is how
--                     long until that waiter's deadline
--         {-1, 0}     a re-entry found the owner's hold gone
local lease = tonumber(ARGV[1])
local me = ARGV[2]
local expected = tonumber(ARGV[3])
local wait = tonumber(ARGV[4])
local clock = tonumber(ARGV[5])
local timeout = tonumber(ARGV[6])

purge(clock)

if expected > 0 then
  local held = tonumber(redis.call('hget', KEYS[1], me) or 0)
  if held == 0 then return {-1, 0} end
  if held ~= expected + 1 then redis.call('hincrby', KEYS[1], me, 1) end
  if lease > 0 and redis.call('pttl', KEYS[1]) < lease then
    redis.call('pexpire', KEYS[1], lease)
  end
  return {1, 0}
end

if redis.call('hget', KEYS[1], me) == '1' then
  -- This acquisition was applied before; only its reply was lost.
  redis.call('pexpire', KEYS[1], lease)
  return {1, tonumber(redis.call('get', KEYS[6]) or 0)}
end

local pttl = redis.call('pttl', KEYS[1])
local head = redis.call('lindex', KEYS[2], 0)
if pttl == -2 and (head == false or head == me) then
  if head == me then
    redis.call('lpop', KEYS[2])
    -- The next waiter is first now. Its wait was bounded by this waiter's
    -- place, not by the lease this acquisition sets, which it must learn (a
    -- holder whose lease runs out publishes nothing): the message is the
    -- lease, negated.
    local next = redis.call('lindex', KEYS[2], 0)
    if next then redis.call(ARGV[7], KEYS[4] .. ':' .. next, '-' .. ARGV[1]) end
  end
  redis.call('zrem', KEYS[3], me)
  redis.call('hdel', KEYS[5], me)
  -- As Redisson's acquisition: every deadline left loses the taker's wait.
  for _, w in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
    redis.call('zincrby', KEYS[3], -wait, w)
  end
  redis.call('hset', KEYS[1], me, 1)
  redis.call('pexpire', KEYS[1], lease)
  return {1, issue_token(KEYS[6], 0, 1, ARGV[8])}
end

-- Take a place at the end of the line, as Redisson's newcomer does, or keep
-- the one we have; either way show we are alive.
local due = redis.call('zscore', KEYS[3], me)
if due then
  due = tonumber(due)
else
  local last = redis.call('lindex', KEYS[2], -1)
  local last_due = last and last ~= me and redis.call('zscore', KEYS[3], last)
  local ahead = pttl
  if last_due then ahead = tonumber(last_due) - clock end
  due = ahead + wait + clock
  redis.call('zadd', KEYS[3], due, me)
end
if not redis.call('lpos', KEYS[2], me) then
  redis.call('rpush', KEYS[2], me)
end
redis.call('hset', KEYS[5], me, (now + timeout) .. ':' .. wait)
local keep = math.max(due - clock, 0) + timeout
if redis.call('pttl', KEYS[5]) < keep then
  redis.call('pexpire', KEYS[5], keep) -- outlives our deadlines in the line
end
-- The lock is free and someone else is first (a dead waiter was skipped, or
-- a wake-up got lost): tell them.
wake_head(ARGV[7], me)

local line = redis.call('lrange', KEYS[2], 0, -1)
if line[1] == me then
  return {2, pttl}
end
-- Behind others: try again when the holder's lease ends, or when a waiter
-- ahead must next show it is alive (ours) or its deadline passes (foreign),
-- whichever comes first; a wake-up on the own channel comes sooner.
local bound = nil
if pttl >= 0 then bound = pttl end
for _, w in ipairs(line) do
  if w == me then break end
  local d = alive_of(redis.call('hget', KEYS[5], w))
  if d then
    d = d - now
  else
    d = tonumber(redis.call('zscore', KEYS[3], w) or clock) - clock
  end
  if not bound or d < bound then bound = d end
end
bound = math.max(bound or 0, 0) + 1
if pttl == -2 and not redis.call('hget', KEYS[5], line[1]) then
  local d = tonumber(redis.call('zscore', KEYS[3], line[1]) or clock) - clock
  return {3, math.max(d, 0) + 1}
end
return {0, bound}
