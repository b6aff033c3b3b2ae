-- fair_acquire.lua: take or re-enter a FairMutex, or keep a place in its
-- line. The lock hash and the token are the Mutex's (acquire.lua); the line
-- is Redisson's RFairLock line (see fairlib.lua), which decides who may take
-- a free lock: the first waiter, or anyone when nobody waits.
--
-- KEYS[1..6]  see fairlib.lua
-- KEYS[7]     the token counter "redisson_lock_token:{<name>}"
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
--                     wake-up at most (ms): until the holder's lease ends,
--                     the first waiter's deadline passes, or a waiter of
--                     ours must next show it is alive, whichever is first
--         {2, pttl}   queued first in line: the holder's PTTL (-1: no
--                     expiry); the waiter then acts on a Mutex's unlock
--                     message too (see lineWake in lines.go)
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

local head, head_due = purge(clock)

if expected > 0 then
  local held = tonumber(redis.call('hget', KEYS[1], me) or 0)
  if held == 0 then return {-1, 0} end
  if held ~= expected + 1 then redis.call('hincrby', KEYS[1], me, 1) end
  if lease > 0 and redis.call('pttl', KEYS[1]) < lease then
    redis.call('pexpire', KEYS[1], lease)
  end
  return {1, 0}
end

local pttl = redis.call('pttl', KEYS[1])
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
  forget(me)
  -- As Redisson's acquisition: every deadline left loses the taker's wait.
  lower_all(wait)
  redis.call('hset', KEYS[1], me, 1)
  redis.call('pexpire', KEYS[1], lease)
  return {1, issue_token(KEYS[7], 0, 1, ARGV[8])}
end

-- Take a place at the end of the line, as Redisson's newcomer does (a
-- waiter with a deadline is in the list: Redisson adds and removes both
-- together), or keep the one we have; either way show we are alive.
local due = redis.call('zscore', KEYS[3], me)
local placed = not due
if placed and pttl ~= -2 and redis.call('hget', KEYS[1], me) == '1' then
  -- This acquisition was applied before; only its reply was lost. (An
  -- acquisition drops the taker's place: a waiter in line does not hold.)
  redis.call('pexpire', KEYS[1], lease)
  return {1, tonumber(redis.call('get', KEYS[7]) or 0)}
end
if placed then
  local ahead = pttl
  if head then
    local last = redis.call('lindex', KEYS[2], -1)
    local last_due = head_due
    if last ~= head then last_due = tonumber(redis.call('zscore', KEYS[3], last)) end
    if last_due then ahead = last_due - clock end
  end
  due = ahead + wait + clock
  redis.call('zadd', KEYS[3], due, me)
  redis.call('rpush', KEYS[2], me)
  if not head then head, head_due = me, due end
else
  due = tonumber(due)
end
if redis.call('zadd', KEYS[5], now + timeout, me) == 1 or placed then
  redis.call('hset', KEYS[6], me, wait)
  -- Our keys outlive our deadlines in the line (deadlines only go down).
  -- (The two keys are always given the same expiry.)
  local keep = math.max(due - clock, 0) + timeout
  if redis.call('pttl', KEYS[5]) < keep then
    redis.call('pexpire', KEYS[5], keep)
    redis.call('pexpire', KEYS[6], keep)
  end
end

if head == me then
  return {2, pttl}
end
-- The lock is free and someone else is first (a dead waiter was skipped, or
-- a wake-up got lost): tell them.
if pttl == -2 then redis.call(ARGV[7], KEYS[4] .. ':' .. head, 0) end
-- Behind others: try again when the holder's lease ends, when the first
-- waiter's deadline passes (Redisson's stale head), or when a waiter of ours
-- must next show it is alive (one that does not is given up wherever it
-- stands), whichever comes first; a wake-up on the own channel comes sooner.
-- A waiter further ahead matters only once it is first, which an
-- acquisition, a leave or a purge makes it: each of those wakes the new
-- first waiter or bounds the next attempt of those behind. So the liveness
-- read is the first waiter's when the lock is free, and our soonest when
-- the lease is longer than a place of ours lasts without a sign of life or
-- there is none; a shorter lease bounds the wait well enough.
local first_due = (head_due or clock) - clock
local bound = first_due
if pttl == -2 then
  local alive = redis.call('zscore', KEYS[5], head)
  if not alive then
    return {3, math.max(first_due, 0) + 1}
  end
  bound = math.min(bound, tonumber(alive) - now)
elseif pttl >= 0 and pttl <= timeout then
  bound = math.min(bound, pttl)
else
  if pttl >= 0 then bound = math.min(bound, pttl) end
  local soonest = redis.call('zrange', KEYS[5], 0, 0, 'withscores')[2]
  if soonest then bound = math.min(bound, tonumber(soonest) - now) end
end
return {0, math.max(bound, 0) + 1}
