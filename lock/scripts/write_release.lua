-- write_release.lua: release one level of the write hold of an RWMutex. The
-- last level frees the lock, or leaves it to the owner's own read holds (a
-- downgrade), and publishes Redisson's message "1": readers may enter.
--
-- KEYS[1..5]  see rwlib.lua
-- ARGV[1]     the owner's write field
-- ARGV[2]     the write hold count the owner believes it has before this call
-- ARGV[3]     the publish command: "publish", or "spublish" on Redis Cluster
--
-- Resent calls are harmless as in release.lua (see rwrelease.lua).
--
-- Returns the write hold count left (0 = released), or -1 when the owner has
-- no write hold.
local me = ARGV[1]
local left = release_level(me, tonumber(ARGV[2]), ARGV[3])
if left then
  return left
end

redis.call('zrem', KEYS[2], me) -- the write hold's lease
purge(ARGV[3])
if redis.call('hlen', KEYS[1]) <= 1 then
  redis.call('del', KEYS[1], KEYS[2])
  freed()
else
  redis.call('hset', KEYS[1], 'mode', 'read')
  hash_ttl(0)
end
redis.call(ARGV[3], KEYS[4], 1)
return 0
