-- permit_acquire.lua: take or re-check a permit of a Semaphore (after
-- permitlib.lua, which describes the keys).
--
-- ARGV[1]  lease in milliseconds; a re-entry only extends the permit's lease
--          to it, never shortens it (0 = keep the lease: re-entry of a fixed lease)
-- ARGV[2]  the holder member "<clientUUID>:<ownerID>"
-- ARGV[3]  the levels the owner believes it holds (0 for a first acquisition)
-- ARGV[4]  the number of permits
-- ARGV[5]  the publish command: "publish", or "spublish" on Redis Cluster
-- ARGV[6]  how long a counter made here lasts after a lease of ours ends (ms)
--
-- Returns {1, free}   acquired (or, for ARGV[3] > 0, still held); free:
--                     permits left
--         {0, wait}   all permits taken; wait: ms until the first lease ends,
--                     -1 when no lease ends (a message will tell)
--         {-1, 0}     the owner's permit (ARGV[3] > 0) is gone
--         {-2, n}     Redis holds n permits for the name, not ARGV[4]: a
--                     first acquisition takes nothing
local now = now_ms()
local lease = tonumber(ARGV[1])
local me = ARGV[2]
local permits = tonumber(ARGV[4])
local idle = tonumber(ARGV[6])

reclaim(now, ARGV[5])

local function extend()
  local mine = tonumber(redis.call('zscore', KEYS[2], me) or 0)
  if mine >= now + lease then return end -- a re-entry never shortens a lease
  redis.call('zadd', KEYS[2], now + lease, me)
  keep(lease + idle)
end

local mine = redis.call('zscore', KEYS[2], me)
local free = redis.call('get', KEYS[1])
if free and not tonumber(free) then
  return redis.error_reply('WRONGTYPE the semaphore\'s key holds a string that is not a count of permits')
end
if tonumber(ARGV[3]) > 0 then
  if not mine or not free then return {-1, 0} end
  if lease > 0 then extend() end
  return {1, tonumber(free)}
end

if not free then
  -- No counter: this package makes one, from the permits not handed out,
  -- with an expiry (see keep); Redisson's clients find it as trySetPermits
  -- would have made it.
  free = math.max(permits - redis.call('zcard', KEYS[2]), 0)
  redis.call('set', KEYS[1], free, 'px', lease + idle)
else
  free = tonumber(free)
  local total = free + redis.call('zcard', KEYS[2])
  if total ~= permits then
    return {-2, total}
  end
end
if mine then
  -- applied before, only its reply was lost
  extend()
  return {1, free}
end
if free > 0 then
  redis.call('decrby', KEYS[1], 1)
  redis.call('zadd', KEYS[2], now + lease, me)
  keep(lease + idle)
  return {1, free - 1}
end
local first = redis.call('zrange', KEYS[2], 0, 0, 'withscores')
if first[2] and tonumber(first[2]) < never then
  return {0, math.max(tonumber(first[2]) - now, 0) + 1}
end
return {0, -1}
