-- read_release.lua: release one level of a read hold of an RWMutex. The last
-- reader out frees the lock and publishes Redisson's unlock message "0".
--
-- KEYS[1..4]  see rwlib.lua
-- ARGV[1]     the owner's read field
-- ARGV[2]     the read hold count the owner believes it has before this call
-- ARGV[3]     the publish command: "publish", or "spublish" on Redis Cluster
--
-- Resent calls are harmless as in release.lua.
--
-- Returns the read hold count left (0 = released), or -1 when the owner has
-- no read hold.
local me = ARGV[1]
local expected = tonumber(ARGV[2])
local held = tonumber(redis.call('hget', KEYS[1], me) or 0)

if held == 0 then
  purge(ARGV[3])
  return -1
end
if expected > 1 and held == expected - 1 then
  return held
end
if expected > 1 and held > 1 then
  return redis.call('hincrby', KEYS[1], me, -1)
end

redis.call('hdel', KEYS[1], me)
redis.call('zrem', KEYS[2], me)
purge(ARGV[3])
if redis.call('hlen', KEYS[1]) <= 1 then
  if redis.call('exists', KEYS[1]) == 1 then
    redis.call('del', KEYS[1], KEYS[2])
    redis.call(ARGV[3], KEYS[4], 0)
  end
elseif redis.call('hget', KEYS[1], 'mode') == 'read' then
  hash_ttl(0)
end
return 0
