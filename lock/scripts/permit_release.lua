-- permit_release.lua: give a Semaphore permit back and wake a waiter (after
-- permitlib.lua, which describes the keys).
--
-- ARGV[1]  the holder member
-- ARGV[2]  the publish command: "publish", or "spublish" on Redis Cluster
-- ARGV[3]  the channel's mark (see markChannel in names.go), "" for none
-- ARGV[4]  "numsub", or "shardnumsub" on Redis Cluster
--
-- Returns {0, foreign}  the permit was given back; foreign: how many of the
--                       channel's subscribers are not Clients of this
--                       package (Redisson's waiters), counted by the mark
--         {-1, 0}       the owner had none (its lease ended, or a copy of
--                       this call gave it back already)
-- The counter goes up by one and its new value is announced, as Redisson's
-- release does; a permit whose lease had ended is counted back all the same.
local score = redis.call('zscore', KEYS[2], ARGV[1])
if not score then
  return {-1, 0}
end
redis.call('zrem', KEYS[2], ARGV[1])
if redis.call('exists', KEYS[1]) == 1 then
  redis.call(ARGV[2], KEYS[3], redis.call('incrby', KEYS[1], 1))
end
if tonumber(score) <= now_ms() then
  return {-1, 0}
end
return {0, foreign_listeners(KEYS[3], ARGV[3], ARGV[4])}
