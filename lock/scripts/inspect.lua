-- inspect.lua: read everything Redis holds for one lock name, in one
-- consistent snapshot, changing nothing.
--
-- KEYS[1]  the lock: a hash (Mutex, FairMutex, RWMutex: Redisson's layouts)
--          or a string, a Semaphore's free permits (Redisson's
--          RPermitExpirableSemaphore layout, see permitlib.lua)
-- KEYS[2]  the token counter "redisson_lock_token:{<name>}"
-- KEYS[3]  a FairMutex's line "redisson_lock_queue:{<name>}"
-- KEYS[4]  its deadlines "redisson_lock_timeout:{<name>}"
-- KEYS[5]  an RWMutex's read leases "seckillguard_rwlock_readers:{<name>}"
-- KEYS[6]  its waiting writers "seckillguard_rwlock_writers:{<name>}"
-- KEYS[7]  the liveness deadlines of the FairMutex's waiters of this
--          package "seckillguard_fair_alive:{<name>}" (see fairlib.lua)
-- KEYS[8]  what an RWMutex's readers' timeout keys start with, "{<name>}"
--          (see rwlib.lua)
-- KEYS[9]  a Semaphore's permits "{<name>}:timeout"
-- ARGV[1]  the most entries to read from each line or set
--
-- Returns {type, pttl, entries, token, token pttl, line, line length,
--          line deadlines, read leases, writers, writers count, server ms,
--          line liveness, read timeouts}:
--   type      TYPE of KEYS[1] ("none", "hash", "zset", ...)
--   entries   HGETALL of the hash, or for a string the permits' set
--             WITHSCORES (at most ARGV[1] members); empty for other types
--   token     the token counter's value, or false when there is none; for
--             a string (a Semaphore), its value: the free permits
--   line      the first ARGV[1] waiters of the fair line, in order, and
--             beside it each one's Redisson deadline (ms of the waiter's
--             client's clock, false when none) and, in line liveness, its
--             liveness deadline (server ms, false for a foreign waiter)
--   read leases, writers   WITHSCORES, at most ARGV[1] members each
--   read timeouts   for an RWMutex hash, each reader field (at most ARGV[1])
--             and the longest PTTL among its timeout keys (-2: none)
local limit = tonumber(ARGV[1])
local typ = redis.call('type', KEYS[1])['ok']
local entries = {}
if typ == 'hash' then
  entries = redis.call('hgetall', KEYS[1])
elseif typ == 'string' then
  entries = redis.call('zrange', KEYS[9], 0, limit - 1, 'withscores')
end
local timeouts = {}
if typ == 'hash' and redis.call('hexists', KEYS[1], 'mode') == 1 then
  for j = 1, #entries, 2 do
    local f, levels = entries[j], tonumber(entries[j + 1])
    if levels and f ~= 'mode' and string.sub(f, -6) ~= ':write' and #timeouts < 2 * limit then
      local longest = -2
      for i = 1, levels do
        local p = redis.call('pttl', KEYS[8] .. ':' .. f .. ':rwlock_timeout:' .. i)
        if p > longest then longest = p end
      end
      timeouts[#timeouts + 1] = f
      timeouts[#timeouts + 1] = longest
    end
  end
end
local line = redis.call('lrange', KEYS[3], 0, limit - 1)
local deadlines, alive = {}, {}
for i, w in ipairs(line) do
  deadlines[i] = redis.call('zscore', KEYS[4], w) or false
  alive[i] = redis.call('zscore', KEYS[7], w) or false
end
return {
  typ,
  redis.call('pttl', KEYS[1]),
  entries,
  typ == 'string' and redis.call('get', KEYS[1]) or redis.call('get', KEYS[2]) or false,
  redis.call('pttl', KEYS[2]),
  line,
  redis.call('llen', KEYS[3]),
  deadlines,
  redis.call('zrange', KEYS[5], 0, limit - 1, 'withscores'),
  redis.call('zrange', KEYS[6], 0, limit - 1, 'withscores'),
  redis.call('zcard', KEYS[6]),
  now_ms(),
  alive,
  timeouts,
}
