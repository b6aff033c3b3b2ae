-- rwlib.lua: helpers of the RWMutex scripts, put in front of them after
-- lib.lua. Every RWMutex script has the same first keys:
--
-- KEYS[1]  the lock: a hash in Redisson's RReadWriteLock layout: "mode" ->
--          "read" or "write"; each reader's field "<clientUUID>:<ownerID>" ->
--          its read hold count; the writer's field "<...>:write" -> its
--          write hold count. PEXPIRE = the longest lease among its holders.
-- KEYS[2]  the holders' leases "seckillguard_rwlock_readers:{<name>}": a
--          sorted set, reader field (and the writer's field) -> server time
--          (ms) its lease ends. Each hold expires on its own: a holder past
--          its lease is dropped from the hash, so one crashed reader never
--          keeps a writer out while the others come and go, and a write hold
--          whose lease ended goes even while its owner's read hold (a
--          downgrade) keeps the hash alive.
-- KEYS[3]  the waiting writers "seckillguard_rwlock_writers:{<name>}": a
--          sorted set, writer field -> server time (ms) by which it must show
--          it is alive. While it is not empty, new readers wait (the lock
--          prefers writers).
-- KEYS[4]  the unlock channel "redisson_rwlock:{<name>}"
-- KEYS[5]  what every reader's timeout keys start with: "{<name>}" (the
--          name itself when it holds a "{"). As in Redisson's
--          RReadWriteLock, each level i of a read hold of field f has a key
--          "<KEYS[5]>:<f>:rwlock_timeout:<i>" whose PTTL is that level's
--          lease, and a read unlock sets the hash's expiry to the longest
--          PTTL among every reader's timeout keys: a reader without them
--          counts for nothing there. Ours have them too, each with the
--          hold's lease (its score in KEYS[2]). These keys are named by the
--          scripts from KEYS[5] and the fields, as Redisson names them;
--          they share the lock's hash slot.
local now = now_ms()

-- tkey returns the timeout key of level level of reader field f.
local function tkey(f, level)
  return KEYS[5] .. ':' .. f .. ':rwlock_timeout:' .. level
end

-- set_timeouts gives levels 1..levels of reader me timeout keys that expire
-- in ms milliseconds, the hold's lease.
local function set_timeouts(me, levels, ms)
  if ms <= 0 then return end
  for i = 1, levels do
    redis.call('set', tkey(me, i), 1, 'px', ms)
  end
end

-- drop_timeouts deletes the timeout keys of levels from..to of reader me.
local function drop_timeouts(me, from, to)
  for i = from, to do
    redis.call('del', tkey(me, i))
  end
end

-- longest_timeout returns the longest PTTL among the timeout keys of every
-- reader in the hash, ours and Redisson's (-3 when there is none), as
-- Redisson's read unlock computes it.
local function longest_timeout()
  local longest = -3
  local all = redis.call('hgetall', KEYS[1])
  for j = 1, #all, 2 do
    local f, levels = all[j], tonumber(all[j + 1])
    if levels and f ~= 'mode' and string.sub(f, -6) ~= ':write' then
      for i = 1, levels do
        local p = redis.call('pttl', tkey(f, i))
        if p > longest then longest = p end
      end
    end
  end
  return longest
end

-- hash_ttl sets the lock's expiry to the end of the longest lease among our
-- holders and every reader's timeout keys (a Redisson reader's too), or at
-- least min_ms, and the readers' set to the same.
local function hash_ttl(min_ms)
  local ttl = min_ms
  local last = redis.call('zrange', KEYS[2], -1, -1, 'withscores')
  if last[2] and tonumber(last[2]) - now > ttl then ttl = tonumber(last[2]) - now end
  local longest = longest_timeout()
  if longest > ttl then ttl = longest end
  if ttl > 0 then
    redis.call('pexpire', KEYS[1], ttl)
    redis.call('pexpire', KEYS[2], ttl)
  end
end

-- lapsed says whether reader field f, holding levels levels, has no lease
-- left anywhere: none in our leases and no timeout key with time left. That
-- is a reader Redisson's read unlock counts for nothing: one of Redisson's
-- that died, or one of ours whose leases' set expired while a Redisson
-- reader kept the hash alive. A reader in our leases is judged by its lease
-- there alone (a reader of ours without timeout keys counts until its lease
-- ends).
local function lapsed(f, levels)
  if redis.call('zscore', KEYS[2], f) then return false end
  for i = levels, 1, -1 do
    if redis.call('pttl', tkey(f, i)) > 0 then return false end
  end
  return true
end

-- purge drops holders whose lease ended, readers that lapsed (see lapsed)
-- and writers that stopped waiting. When that frees the lock, or leaves only
-- readers where a writer held, it wakes the waiters (publish: the command).
local function purge(publish)
  local dead = redis.call('zrangebyscore', KEYS[2], '-inf', now)
  local writer = false
  for _, f in ipairs(dead) do
    if string.sub(f, -6) == ':write' then
      writer = true
    else
      drop_timeouts(f, 1, tonumber(redis.call('hget', KEYS[1], f) or 0))
    end
    redis.call('hdel', KEYS[1], f)
  end
  redis.call('zremrangebyscore', KEYS[2], '-inf', now)
  local gone = #dead
  local all = redis.call('hgetall', KEYS[1])
  for j = 1, #all, 2 do
    local f, levels = all[j], tonumber(all[j + 1])
    if levels and f ~= 'mode' and string.sub(f, -6) ~= ':write' and lapsed(f, levels) then
      redis.call('hdel', KEYS[1], f)
      gone = gone + 1
    end
  end
  if gone > 0 then
    if redis.call('hlen', KEYS[1]) <= 1 then
      redis.call('del', KEYS[1], KEYS[2])
      redis.call(publish, KEYS[4], 0)
    elseif writer then
      -- The write hold's lease ended under its owner's read hold (a
      -- downgrade): the readers hold the lock now.
      redis.call('hset', KEYS[1], 'mode', 'read')
      hash_ttl(0)
      redis.call(publish, KEYS[4], 1)
    elseif redis.call('hget', KEYS[1], 'mode') == 'read' then
      hash_ttl(0)
    end
  end
  redis.call('zremrangebyscore', KEYS[3], '-inf', now)
end

-- freed marks the lock as freed by this package a moment ago: for
-- foreignYield (10 ms), a Redisson writer that listens on the channel takes
-- it before our new readers (see read_acquire.lua). The mark is named from
-- KEYS[5], as the timeout keys are, and is not a count (Scan passes it by).
local function freed()
  redis.call('set', KEYS[5] .. ':seckillguard_freed', 'x', 'px', 10)
end

-- wait_bound returns how long a waiter should wait for an unlock message at
-- most: until the lock expires, or until the first lease among the holders
-- (a reader may have died) or the first deadline among the waiting writers
-- (a writer may have died) comes up for renewal.
local function wait_bound(also_writers)
  local wait = redis.call('pttl', KEYS[1])
  local sets = {KEYS[2]}
  if also_writers then sets[2] = KEYS[3] end
  for _, k in ipairs(sets) do
    local first = redis.call('zrange', k, 0, 0, 'withscores')
    if first[2] then
      local d = math.max(tonumber(first[2]) - now, 0) + 1
      if wait < 0 or d < wait then wait = d end
    end
  end
  return wait
end
