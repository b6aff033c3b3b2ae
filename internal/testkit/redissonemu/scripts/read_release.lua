-- read_release.lua: an RReadWriteLock read unlock, as the Java client makes
-- it. The level's timeout key goes; if the hash holds anyone else, its
-- expiry becomes the longest remaining PTTL over every reader's timeout
-- keys (a reader without such keys counts for nothing); when none is left
-- and no writer holds it, the hash is deleted and "0" sent.
--
-- KEYS[1]  the hash
-- KEYS[2]  the channel "redisson_rwlock:{<name>}"
-- KEYS[3]  this reader's timeout prefix
-- KEYS[4]  the key prefix every reader's timeout keys start with: "{<name>}"
-- ARGV[1]  the reader's field
-- ARGV[2]  the publish command
--
-- Returns -1 not held, 0 still held (by anyone), 1 freed.
local mode = redis.call('hget', KEYS[1], 'mode')
if not mode then
  redis.call(ARGV[2], KEYS[2], 0)
  return -1
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return -1
end
local left = redis.call('hincrby', KEYS[1], ARGV[1], -1)
if left == 0 then
  redis.call('hdel', KEYS[1], ARGV[1])
end
redis.call('del', KEYS[3] .. ':' .. (left + 1))

if redis.call('hlen', KEYS[1]) > 1 then
  local longest = -3
  for _, field in ipairs(redis.call('hkeys', KEYS[1])) do
    local levels = tonumber(redis.call('hget', KEYS[1], field))
    if levels then
      for i = 1, levels do
        local p = redis.call('pttl', KEYS[4] .. ':' .. field .. ':rwlock_timeout:' .. i)
        if p > longest then longest = p end
      end
    end
  end
  if longest > 0 then
    redis.call('pexpire', KEYS[1], longest)
    return 0
  end
  if mode == 'write' then
    return 0
  end
end
redis.call('del', KEYS[1])
redis.call(ARGV[2], KEYS[2], 0)
return 1
