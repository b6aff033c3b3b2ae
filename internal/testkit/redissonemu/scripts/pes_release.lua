-- pes_release.lua: an RPermitExpirableSemaphore release by permit id: the
-- id leaves the set, the counter goes up by one and its new value is sent.
--
-- KEYS[1]  the counter, KEYS[2] the permits, KEYS[3] the channel
-- ARGV[1]  the permit id, ARGV[2] the client's clock (ms), ARGV[3] the publish command
--
-- Returns -1 no such permit, 0 released but it had expired, 1 released.
local expiry = redis.call('zscore', KEYS[2], ARGV[1])
if not expiry then
  return -1
end
redis.call('zrem', KEYS[2], ARGV[1])
redis.call(ARGV[3], KEYS[3], redis.call('incrby', KEYS[1], 1))
if tonumber(expiry) <= tonumber(ARGV[2]) then
  return 0
end
return 1
