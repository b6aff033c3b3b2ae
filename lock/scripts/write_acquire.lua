-- write_acquire.lua: take or re-enter the write hold of an RWMutex, or keep
-- the owner's place among the waiting writers (which keeps new readers out).
--
-- KEYS[1..5]  see rwlib.lua
-- KEYS[6]     the token counter "redisson_lock_token:{<name>}"
-- ARGV[1]     lease in milliseconds; a re-entry only extends the hold to it,
--             never shortens it (0 = keep the expiry: re-entry of a fixed lease)
-- ARGV[2]     the owner's write field "<clientUUID>:<ownerID>:write"
-- ARGV[3]     the owner's read field "<clientUUID>:<ownerID>"
-- ARGV[4]     the write hold count the owner believes it has before this
--             call (0 for a first acquisition); makes resent calls harmless
-- ARGV[5]     the publish command: "publish", or "spublish" on Redis Cluster
-- ARGV[6]     how long a waiting writer's place lasts without a sign of life (ms)
-- ARGV[7]     the token counter's idle expiry in milliseconds, "0" for none
--
-- Returns {1, token}  acquired (token 0 on a re-entry)
--         {0, wait}   refused and waiting; wait: how long to wait for a
--                     wake-up at most (ms)
--         {-1, 0}     a re-entry found the owner's hold gone
--         {-2, 0}     the owner holds a read lock: an upgrade would deadlock
local lease = tonumber(ARGV[1])
local me = ARGV[2]
local expected = tonumber(ARGV[4])
local timeout = tonumber(ARGV[6])

purge(ARGV[5])

local held = tonumber(redis.call('hget', KEYS[1], me) or 0)
if expected > 0 then
  if held == 0 then return {-1, 0} end
  if held ~= expected + 1 then redis.call('hincrby', KEYS[1], me, 1) end
  -- The write hold's own lease (its score among the leases) only ever
  -- moves later; the hash lasts until the longest lease among its holders.
  if lease > 0 then
    if tonumber(redis.call('zscore', KEYS[2], me) or 0) < now + lease then
      redis.call('zadd', KEYS[2], now + lease, me)
    end
    hash_ttl(lease)
  end
  return {1, 0}
end
if held == 1 then
  -- This acquisition was applied before; only its reply was lost.
  redis.call('zadd', KEYS[2], now + lease, me)
  hash_ttl(lease)
  redis.call('zrem', KEYS[3], me)
  return {1, tonumber(redis.call('get', KEYS[6]) or 0)}
end

local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false and redis.call('exists', KEYS[1]) == 0 then
  redis.call('del', KEYS[2])
  redis.call('hset', KEYS[1], 'mode', 'write', me, 1)
  redis.call('zadd', KEYS[2], now + lease, me)
  hash_ttl(lease)
  redis.call('zrem', KEYS[3], me)
  return {1, issue_token(KEYS[6], 0, 1, ARGV[7])}
end
if redis.call('hexists', KEYS[1], ARGV[3]) == 1 then
  return {-2, 0}
end

-- Wait in line; from now on new readers wait too.
redis.call('zadd', KEYS[3], now + timeout, me)
if redis.call('pttl', KEYS[3]) < timeout then
  redis.call('pexpire', KEYS[3], timeout)
end
return {0, wait_bound(false)}
