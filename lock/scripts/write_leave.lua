-- write_leave.lua: a writer that gives up waiting leaves the line; when no
-- writer waits any more, the readers it kept out are woken.
--
-- KEYS[1..5]  see rwlib.lua
-- ARGV[1]     the owner's write field
-- ARGV[2]     the publish command: "publish", or "spublish" on Redis Cluster
-- ARGV[3]     "1" to also drop a first-level write hold of the owner (an
--             acquisition whose reply was lost), "0" not to
--
-- Returns 1 when the owner was waiting, 0 when not.
local had = redis.call('zrem', KEYS[3], ARGV[1])
local wake = false
if ARGV[3] == '1' and redis.call('hget', KEYS[1], ARGV[1]) == '1' then
  redis.call('hdel', KEYS[1], ARGV[1])
  redis.call('zrem', KEYS[2], ARGV[1]) -- its lease
  if redis.call('hlen', KEYS[1]) <= 1 then
    redis.call('del', KEYS[1], KEYS[2])
  else
    redis.call('hset', KEYS[1], 'mode', 'read')
  end
  wake = true
end
purge(ARGV[2])
if wake or (had == 1 and redis.call('zcard', KEYS[3]) == 0) then
  redis.call(ARGV[2], KEYS[4], 1)
end
return had
