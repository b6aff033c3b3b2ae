-- fairlib.lua: helpers of the FairMutex scripts, put in front of them after
-- lib.lua. The line is Redisson's RFairLock line, read and written with its
-- meaning, so that waiters of this package and of Redisson stand in one
-- line; what this package adds lives in a key Redisson never reads. Every
-- fair script has the same first keys:
--
-- KEYS[1]  the lock: a hash in Redisson's RLock layout
-- KEYS[2]  the queue "redisson_lock_queue:{<name>}": a list of owner fields
--          in arrival order, head first (Redisson's)
-- KEYS[3]  the deadlines "redisson_lock_timeout:{<name>}": a sorted set,
--          owner field -> the waiter's deadline on its client's clock (ms),
--          as Redisson computes it: a newcomer's is the last waiter's
--          deadline (or, in an empty line, now plus the lock's PTTL) plus its
--          wait; an acquisition lowers every deadline by the taker's wait; a
--          waiter that leaves lowers those behind it by its wait; a head
--          whose deadline passed is stale and dropped (Redisson's)
-- KEYS[4]  the prefix of the waiters' channels, Redisson's
--          "redisson_lock__channel:{<name>}": the waiter with field f is woken
--          on "<prefix>:<f>" with the message "0", so an unlock wakes exactly
--          the next waiter. The prefix is also the unlock channel of a Mutex
--          of the same name.
-- KEYS[5]  the liveness of this package's waiters
--          "seckillguard_fair_alive:{<name>}": a hash, owner field ->
--          "<deadline>:<wait>", the server time (ms) by which the waiter must
--          show it is alive (an attempt, or the watchdog's fair_alive.lua) and
--          the wait its deadline in KEYS[3] was counted with. A waiter with
--          an entry here is ours; one without is foreign (Redisson's).
local now = now_ms()

-- alive_of parses a liveness entry: its deadline and wait (nil when malformed).
local function alive_of(v)
  local d, w = string.match(v or '', '^(%-?%d+):(%d+)$')
  return tonumber(d), tonumber(w)
end

-- leave_line removes the waiter f from the line as Redisson's waiter that
-- gives up does: every waiter behind it has its deadline lowered by f's wait.
local function leave_line(f, wait)
  local behind = false
  for _, w in ipairs(redis.call('lrange', KEYS[2], 0, -1)) do
    if behind then
      redis.call('zincrby', KEYS[3], -wait, w)
    elseif w == f then
      behind = true
    end
  end
  redis.call('zrem', KEYS[3], f)
  redis.call('lrem', KEYS[2], 0, f)
  redis.call('hdel', KEYS[5], f)
end

-- purge gives away the places that are over: Redisson's stale heads (their
-- deadline passed on clock, the caller's clock, as Redisson compares it),
-- and the places of our waiters that stopped showing they are alive,
-- wherever they stand (they leave as a waiter that gives up does).
local function purge(clock)
  while true do
    local head = redis.call('lindex', KEYS[2], 0)
    if not head then break end
    local due = redis.call('zscore', KEYS[3], head)
    if not due or tonumber(due) > clock then break end
    redis.call('zrem', KEYS[3], head)
    redis.call('lpop', KEYS[2])
    redis.call('hdel', KEYS[5], head)
  end
  local alive = redis.call('hgetall', KEYS[5])
  for i = 1, #alive, 2 do
    local f = alive[i]
    local d, w = alive_of(alive[i + 1])
    if not d or d <= now then
      leave_line(f, w or 0)
    elseif not redis.call('zscore', KEYS[3], f) then
      redis.call('hdel', KEYS[5], f) -- its place was dropped as stale
    end
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
