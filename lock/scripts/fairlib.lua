-- fairlib.lua: helpers of the FairMutex scripts, put in front of them after
-- lib.lua. Every fair script has the same first keys:
--
-- KEYS[1]  the lock: a hash in Redisson's RLock layout
-- KEYS[2]  the queue "redisson_lock_queue:{<name>}": a list of owner fields
--          in arrival order, head first
-- KEYS[3]  the deadlines "redisson_lock_timeout:{<name>}": a sorted set, owner
--          field -> server time (ms) by which that waiter must show it is
--          alive (an attempt, or the watchdog's waiting.lua)
-- KEYS[4]  the prefix of the waiters' channels, Redisson's
--          "redisson_lock__channel:{<name>}": the waiter with field f is woken
--          on "<prefix>:<f>", so an unlock wakes exactly the next waiter. The
--          prefix is also the unlock channel of a Mutex of the same name.
local now = now_ms()

-- purge gives away the places of waiters that stopped showing they are alive.
local function purge()
  local dead = redis.call('zrangebyscore', KEYS[3], '-inf', now)
  for _, f in ipairs(dead) do
    redis.call('lrem', KEYS[2], 0, f)
  end
  if #dead > 0 then
    redis.call('zremrangebyscore', KEYS[3], '-inf', now)
  end
end

-- wake_head tells the first waiter, unless it is except, to try now if the
-- lock is free.
local function wake_head(publish, except)
  if redis.call('exists', KEYS[1]) == 1 then return end
  local head = redis.call('lindex', KEYS[2], 0)
  if head and head ~= except then
    redis.call(publish, KEYS[4] .. ':' .. head, 0)
  end
end

-- freed tells the waiters that this call freed the lock: the first waiter
-- in line, and the waiters of a Mutex of the same name (which excludes a
-- FairMutex of its name) on its unlock channel, Redisson's message "0".
local function freed(publish)
  redis.call(publish, KEYS[4], 0)
  wake_head(publish, nil)
end

-- line_ttl keeps the queue and the deadlines no longer than their last
-- waiter could live.
local function line_ttl(timeout)
  for k = 2, 3 do
    if redis.call('pttl', KEYS[k]) < timeout then
      redis.call('pexpire', KEYS[k], timeout)
    end
  end
end
