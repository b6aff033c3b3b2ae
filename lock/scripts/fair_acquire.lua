-- fair_acquire.lua: take or re-enter a FairMutex, or keep a place in its
-- queue. The lock hash and the token are the Mutex's (acquire.lua); the
-- queue decides who may take a free lock: the first live waiter, or anyone
-- when nobody waits.
--
-- KEYS[1..4]  see fairlib.lua
-- KEYS[5]     the token counter "redisson_lock_token:{<name>}"
-- ARGV[1]     lease in milliseconds; a re-entry only extends the expiry to it,
--             never shortens it (0 = keep the expiry: re-entry of a fixed lease)
-- ARGV[2]     the owner field
-- ARGV[3]     the hold count the owner believes it has before this call (0 for
--             a first acquisition); makes resent calls harmless, as in acquire.lua
-- ARGV[4]     how long a place in the queue lasts without a sign of life (ms)
-- ARGV[5]     the publish command: "publish", or "spublish" on Redis Cluster
-- ARGV[6]     the token counter's idle expiry in milliseconds, "0" for none
--
-- The first waiter that acquires tells the next one, on its channel, the
-- lease it took ("-<ms>"): that one tries again when the lease ends at the
-- latest.
--
-- Returns {1, token}  acquired (token 0 on a re-entry: the owner keeps its own)
--         {0, wait}   queued behind others; wait is how long to wait for a
--                     wake-up at most (ms): until the waiter ahead must next
--                     show it is alive
--         {2, pttl}   queued first in line: the holder's PTTL (-1: no
--                     expiry); the waiter then acts on a Mutex's unlock
--                     message too (see lineWake in queue.go)
--         {-1, 0}     a re-entry found the owner's hold gone
local lease = tonumber(ARGV[1])
local me = ARGV[2]
local expected = tonumber(ARGV[3])
local timeout = tonumber(ARGV[4])

purge()

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
  return {1, tonumber(redis.call('get', KEYS[5]) or 0)}
end

local pttl = redis.call('pttl', KEYS[1])
local head = redis.call('lindex', KEYS[2], 0)
if pttl == -2 and (head == false or head == me) then
  if head == me then
    redis.call('lpop', KEYS[2])
    -- The next waiter is first now. Its wait was bounded by this waiter's
    -- place, not by the lease this acquisition sets, which it must learn (a
    -- holder whose lease runs out publishes nothing): the message is the
    -- lease, negated. Redisson's waiters act on 0 and 1 only.
    local next = redis.call('lindex', KEYS[2], 0)
    if next then redis.call(ARGV[5], KEYS[4] .. ':' .. next, '-' .. ARGV[1]) end
  end
  redis.call('zrem', KEYS[3], me)
  redis.call('hset', KEYS[1], me, 1)
  redis.call('pexpire', KEYS[1], lease)
  return {1, issue_token(KEYS[5], 0, 1, ARGV[6])}
end

-- Take a place at the end of the line, or renew the one we have.
if redis.call('zadd', KEYS[3], now + timeout, me) == 1 then
  redis.call('rpush', KEYS[2], me)
end
line_ttl(timeout)
-- The lock is free and someone else is first (a dead waiter was skipped, or
-- a wake-up got lost): tell them.
wake_head(ARGV[5], me)

local pos = redis.call('lpos', KEYS[2], me)
if not pos then -- the list expired under its deadlines: line up again
  pos = redis.call('rpush', KEYS[2], me) - 1
end
if pos == 0 then
  return {2, pttl}
end
local ahead = redis.call('lindex', KEYS[2], pos - 1)
local due = tonumber(redis.call('zscore', KEYS[3], ahead) or now)
return {0, math.max(due - now, 0) + 1}
