-- peslib.lua: put in front of the RPermitExpirableSemaphore scripts.
-- KEYS[1] is the counter (permits left), KEYS[2] the permits handed out: a
-- sorted set "{<name>}:timeout", permit id -> expiry in ms of the Java
-- client's clock.

-- reclaim gives the permits whose expiry is not after now back to the
-- counter (at most limit of them, all when limit is -1) and sends the new
-- count on the channel when it is positive.
local function reclaim(now, limit, channel, publish)
  local gone = redis.call('zrangebyscore', KEYS[2], 0, now, 'limit', 0, limit)
  if #gone == 0 then return end
  redis.call('zrem', KEYS[2], unpack(gone))
  local left = redis.call('incrby', KEYS[1], #gone)
  if left > 0 then redis.call(publish, channel, left) end
end
