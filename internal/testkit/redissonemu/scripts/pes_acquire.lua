-- pes_acquire.lua: an RPermitExpirableSemaphore acquisition (after
-- peslib.lua). Expired permits are reclaimed first (at most as many as are
-- asked for); then n permits are taken from the counter and their ids
-- recorded with their expiry. The set of permits takes the counter's
-- expiry when the counter has one.
--
-- KEYS[1]  the counter, KEYS[2] the permits, KEYS[3] the channel
-- ARGV[1]  n, ARGV[2] the permits' expiry (ms; ARGV[4] for no expiry)
-- ARGV[3]  the client's clock (ms), ARGV[4] the "never expires" score
-- ARGV[5]  the publish command, ARGV[6..] the permit ids
--
-- Returns {1} taken; {0, expiry} not enough permits and the earliest expiry
-- of a permit handed out; {0} not enough and none will expire.
local n = tonumber(ARGV[1])
reclaim(ARGV[3], n, KEYS[3], ARGV[5])
local left = tonumber(redis.call('get', KEYS[1]) or -1)
if left >= n then
  redis.call('decrby', KEYS[1], n)
  for i = 6, #ARGV do
    redis.call('zadd', KEYS[2], ARGV[2], ARGV[i])
  end
  local pttl = redis.call('pttl', KEYS[1])
  if pttl > 0 then redis.call('pexpire', KEYS[2], pttl) end
  return {1}
end
local first = redis.call('zrange', KEYS[2], 0, 0, 'withscores')
if first[2] and first[2] ~= ARGV[4] then
  return {0, tonumber(first[2])}
end
return {0}
