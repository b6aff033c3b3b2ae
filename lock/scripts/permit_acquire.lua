-- permit_acquire.lua: take or re-check a permit of a Semaphore.
--
-- KEYS[1]  the semaphore: a sorted set named after it, holder member
--          "<clientUUID>:<ownerID>" -> server time (ms) its lease ends.
--          PEXPIRE = the longest lease. A holder past its lease is dropped
--          by the next script that looks, so a dead holder's permit returns
--          by itself.
-- KEYS[2]  the release channel "redisson_sc:{<name>}"
-- ARGV[1]  lease in milliseconds; a re-entry only extends the permit's lease
--          to it, never shortens it (0 = keep the lease: re-entry of a fixed lease)
-- ARGV[2]  the holder member
-- ARGV[3]  the levels the owner believes it holds (0 for a first acquisition)
-- ARGV[4]  the number of permits
-- ARGV[5]  the publish command: "publish", or "spublish" on Redis Cluster
--
-- Returns {1, free}   acquired (or, for ARGV[3] > 0, still held); free:
--                     permits left
--         {0, wait}   all permits taken; wait: ms until the first lease ends
--         {-1, 0}     the owner's permit (ARGV[3] > 0) is gone
local now = now_ms()
local lease = tonumber(ARGV[1])
local me = ARGV[2]
local permits = tonumber(ARGV[4])

if redis.call('zremrangebyscore', KEYS[1], '-inf', now) > 0 then
  redis.call(ARGV[5], KEYS[2], 0)
end

local function extend()
  local mine = tonumber(redis.call('zscore', KEYS[1], me) or 0)
  if mine >= now + lease then return end -- a re-entry never shortens a lease
  redis.call('zadd', KEYS[1], now + lease, me)
  local last = redis.call('zrange', KEYS[1], -1, -1, 'withscores')
  redis.call('pexpire', KEYS[1], math.max(tonumber(last[2]) - now, 1))
end

local mine = redis.call('zscore', KEYS[1], me)
if tonumber(ARGV[3]) > 0 then
  if not mine then return {-1, 0} end
  if lease > 0 then extend() end
  return {1, permits - redis.call('zcard', KEYS[1])}
end
if mine or redis.call('zcard', KEYS[1]) < permits then
  -- (mine: applied before, only its reply was lost)
  extend()
  return {1, permits - redis.call('zcard', KEYS[1])}
end
local first = redis.call('zrange', KEYS[1], 0, 0, 'withscores')
return {0, math.max(tonumber(first[2]) - now, 0) + 1}
