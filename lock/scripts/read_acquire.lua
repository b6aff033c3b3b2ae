-- read_acquire.lua: take or re-enter a read hold of an RWMutex.
--
-- KEYS[1..5]  see rwlib.lua
-- ARGV[1]     lease in milliseconds; a re-entry only extends the owner's lease
--             to it, never shortens it (0 = keep the lease: re-entry of a fixed lease)
-- ARGV[2]     the owner's read field "<clientUUID>:<ownerID>"
-- ARGV[3]     the owner's write field "<clientUUID>:<ownerID>:write"
-- ARGV[4]     the read hold count the owner believes it has before this call
--             (0 for a first acquisition); makes resent calls harmless
-- ARGV[5]     the publish command: "publish", or "spublish" on Redis Cluster
-- ARGV[6]     the channel's mark (see markChannel in names.go), "" for none
-- ARGV[7]     "numsub", or "shardnumsub" on Redis Cluster
--
-- A first read hold is granted when the lock is free or read-held and no
-- writer waits, or when the owner holds the write lock (downgrade). A free
-- lock with a writer in line waits for that writer: it was woken by the
-- release that freed the lock, and a reader arriving in between must not
-- take its turn. Re-entries are always granted, even with writers waiting:
-- the owner's hold keeps them waiting anyway, and refusing would deadlock it.
--
-- A Redisson writer does not stand in the writers' line; it listens on the
-- channel while it waits. Left to the races, our readers, which take a
-- lock freed by our last reader or writer in one round trip where the woken
-- Java thread needs the message, its wake-up and a round trip, would keep it
-- out nearly every time. So for 10 ms after this package freed the lock
-- (see freed in rwlib.lua), a client other than our Clients that listens on
-- the channel (it can only be a writer: Redisson's readers wait only for a
-- writer) is let in first. The bound keeps a Java writer that missed its
-- wake-up (Redisson wakes only the threads parked at the message) from
-- holding our readers back until its own retry.
--
-- Returns {1, 0}     acquired
--         {0, wait}  refused; wait: how long to wait for a wake-up at most (ms)
--         {-1, 0}    a re-entry found the owner's hold gone
local lease = tonumber(ARGV[1])
local me = ARGV[2]
local expected = tonumber(ARGV[4])

purge(ARGV[5])

-- extend moves the owner's lease to now + lease unless it ends later
-- already (lease 0: keep it), and gives each of its levels a timeout key
-- that ends with it (see rwlib.lua), so a Redisson read unlock counts it.
local function extend()
  local mine = tonumber(redis.call('zscore', KEYS[2], me) or 0)
  set_timeouts(me, tonumber(redis.call('hget', KEYS[1], me) or 0), math.max(mine, now + lease) - now)
  if lease == 0 or mine >= now + lease then return end -- a re-entry never shortens a lease
  redis.call('zadd', KEYS[2], now + lease, me)
  -- The hash and our leases' set last at least this lease; a longer expiry
  -- (another holder's lease, a writer's under a downgrade, a Redisson
  -- reader's) is never cut short, so no other reader needs reading here.
  for _, k in ipairs({KEYS[1], KEYS[2]}) do
    if redis.call('pttl', k) < lease then redis.call('pexpire', k, lease) end
  end
end

local held = tonumber(redis.call('hget', KEYS[1], me) or 0)
if expected > 0 then
  if held == 0 then return {-1, 0} end
  if held ~= expected + 1 then redis.call('hincrby', KEYS[1], me, 1) end
  extend()
  return {1, 0}
end
if held == 1 then
  -- This acquisition was applied before; only its reply was lost.
  extend()
  return {1, 0}
end

local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false and redis.call('exists', KEYS[1]) == 1 then
  -- A hash without a mode is not an RWMutex's (a Mutex of the same name?):
  -- wait for it like for a writer.
  return {0, wait_bound(false)}
end
local yield = 0
if mode == false then
  yield = redis.call('pttl', KEYS[5] .. ':seckillguard_freed')
  if yield > 0 and foreign_listeners(KEYS[4], ARGV[6], ARGV[7]) == 0 then yield = 0 end
end
if (mode ~= 'write' and redis.call('zcard', KEYS[3]) == 0 and yield <= 0)
  or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
  if mode == false then
    redis.call('hset', KEYS[1], 'mode', 'read')
  end
  redis.call('hset', KEYS[1], me, 1)
  extend()
  return {1, 0}
end
if yield > 0 then
  -- Freed by us a moment ago, with a Redisson writer woken to take it:
  -- look again when the yield ends (its lock message ends the wait first).
  return {0, yield + 1}
end
return {0, wait_bound(mode ~= 'write')}
