-- read_release.lua: release one level of a read hold of an RWMutex, and its
-- timeout key. The last reader out frees the lock and publishes Redisson's
-- unlock message "0"; while others hold it, its expiry is the longest lease
-- left among them, their timeout keys included (see rwlib.lua).
--
-- KEYS[1..5]  see rwlib.lua
-- ARGV[1]     the owner's read field
-- ARGV[2]     the read hold count the owner believes it has before this call
-- ARGV[3]     the publish command: "publish", or "spublish" on Redis Cluster
--
-- Resent calls are harmless as in release.lua (see rwrelease.lua).
--
-- Returns the read hold count left (0 = released), or -1 when the owner has
-- no read hold.
local me = ARGV[1]
local held = tonumber(redis.call('hget', KEYS[1], me) or 0)
local left = release_level(me, tonumber(ARGV[2]), ARGV[3])
if left then
  -- The released level's timeout key goes with it (see rwlib.lua).
  if left >= 0 and left < held then drop_timeouts(me, left + 1, held) end
  return left
end
drop_timeouts(me, 1, held)

redis.call('zrem', KEYS[2], me)
purge(ARGV[3])
if redis.call('hlen', KEYS[1]) <= 1 then
  if redis.call('exists', KEYS[1]) == 1 then
    redis.call('del', KEYS[1], KEYS[2])
    freed()
    redis.call(ARGV[3], KEYS[4], 0)
  end
elseif redis.call('hget', KEYS[1], 'mode') == 'read' then
  hash_ttl(0)
end
return 0
