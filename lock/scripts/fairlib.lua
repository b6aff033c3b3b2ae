-- fairlib.lua: helpers of the FairMutex scripts, put in front of them after
-- lib.lua. The line is Redisson's RFairLock line, read and written with its
-- meaning, so that waiters of this package and of Redisson stand in one
-- line; what this package adds lives in keys Redisson never reads. Every
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
--          "seckillguard_fair_alive:{<name>}": a sorted set, owner field ->
--          the server time (ms) by which the waiter must show it is alive
--          (an attempt, or the watchdog's fair_alive.lua). A waiter with an
--          entry here is ours; one without is foreign (Redisson's). Sorted by
--          deadline, so the places that ran out are found without reading
--          the others (see purge).
-- KEYS[6]  the waits of this package's waiters "seckillguard_fair_wait:{<name>}":
--          a hash, owner field -> the wait (ms) its deadline in KEYS[3] was
--          counted with, written when it takes its place
local now = now_ms()

-- lower lowers the deadlines of the waiters ws (owner fields) by wait, as
-- Redisson's ZINCRBY of -wait on each does (a waiter without a deadline gets
-- -wait, as ZINCRBY gives it), in two commands whatever their number: their
-- scores read at once, and written back by one ZADD. The sums are ZINCRBY's:
-- the same doubles added, written back exactly (a Lua number passed to a
-- command is written with 17 significant digits).
local function lower(ws, wait)
  local step = 1000 -- well inside what unpack can pass to one call
  for i = 1, #ws, step do
    local part = {unpack(ws, i, math.min(i + step - 1, #ws))}
    local scores = redis.call('zmscore', KEYS[3], unpack(part))
    local args = {}
    for j, w in ipairs(part) do
      args[#args + 1] = tonumber(scores[j] or 0) - wait
      args[#args + 1] = w
    end
    redis.call('zadd', KEYS[3], unpack(args))
  end
end

-- lower_all lowers every deadline in the line by wait, as Redisson's
-- acquisition does (ZINCRBY over ZRANGE 0 -1), in two commands.
local function lower_all(wait)
  local all = redis.call('zrange', KEYS[3], 0, -1, 'withscores')
  local step = 2000 -- members and scores, as above
  for i = 1, #all, step do
    local args = {}
    for j = i, math.min(i + step - 1, #all), 2 do
      args[#args + 1] = tonumber(all[j + 1]) - wait
      args[#args + 1] = all[j]
    end
    redis.call('zadd', KEYS[3], unpack(args))
  end
end

-- forget drops what this package keeps of the waiter f.
local function forget(f)
  if redis.call('zrem', KEYS[5], f) == 1 then
    redis.call('hdel', KEYS[6], f)
  end
end

-- leave_line removes the waiter f from the line as Redisson's waiter that
-- gives up does: every waiter behind it has its deadline lowered by f's wait.
local function leave_line(f, wait)
  local behind = {}
  local found = false
  for _, w in ipairs(redis.call('lrange', KEYS[2], 0, -1)) do
    if found then
      behind[#behind + 1] = w
    elseif w == f then
      found = true
    end
  end
  if #behind > 0 then lower(behind, wait) end
  redis.call('zrem', KEYS[3], f)
  redis.call('lrem', KEYS[2], 0, f)
  forget(f)
end

-- stale_heads drops Redisson's stale heads: the first waiters whose
-- deadline passed on clock, the caller's clock, as Redisson compares it (the
-- other deadlines untouched, as Redisson leaves them). Returns the first
-- waiter left (false when none) and its deadline (nil when it has none).
local function stale_heads(clock)
  while true do
    local head = redis.call('lindex', KEYS[2], 0)
    if not head then return false, nil end
    local due = redis.call('zscore', KEYS[3], head)
    if not due or tonumber(due) > clock then return head, tonumber(due) end
    redis.call('zrem', KEYS[3], head)
    redis.call('lpop', KEYS[2])
    forget(head)
  end
end

-- purge gives away the places that are over: Redisson's stale heads, and
-- the places of our waiters that stopped showing they are alive, wherever
-- they stand (they leave as a waiter that gives up does). Only the places
-- that ran out are read, so a call costs the same however long the line. A
-- liveness entry whose place Redisson's stale purge dropped stays until its
-- own deadline: its waiter, if alive, queues again at its next attempt, and
-- the watchdog finds the place gone (fair_alive.lua). Returns what
-- stale_heads returns.
local function purge(clock)
  local head, due = stale_heads(clock)
  local dead = redis.call('zrangebyscore', KEYS[5], '-inf', now)
  if #dead == 0 then return head, due end
  for _, f in ipairs(dead) do
    leave_line(f, tonumber(redis.call('hget', KEYS[6], f) or 0))
  end
  return stale_heads(clock)
end

-- wake_head tells head, the first waiter (false when none), to try now if
-- the lock is free.
local function wake_head(publish, head)
  if head and redis.call('exists', KEYS[1]) == 0 then
    redis.call(publish, KEYS[4] .. ':' .. head, 0)
  end
end

-- freed tells the waiters that this call freed the lock: head, the first
-- waiter in line (false when none), and the waiters of a Mutex of the same
-- name (which excludes a FairMutex of its name) on its unlock channel,
-- Redisson's message "0".
local function freed(publish, head)
  redis.call(publish, KEYS[4], 0)
  if head then redis.call(publish, KEYS[4] .. ':' .. head, 0) end
end
