-- pes_update.lua: RPermitExpirableSemaphore.updateLeaseTime (after
-- peslib.lua): expired permits are reclaimed, then a permit still handed
-- out gets a new expiry.
--
-- KEYS[1]  the counter, KEYS[2] the permits, KEYS[3] the channel
-- ARGV[1]  the permit id, ARGV[2] its new expiry (ms), ARGV[3] the client's
--          clock (ms), ARGV[4] the publish command
--
-- Returns 1 updated, 0 no such permit (released or expired).
reclaim(ARGV[3], -1, KEYS[3], ARGV[4])
if not redis.call('zscore', KEYS[2], ARGV[1]) then
  return 0
end
redis.call('zadd', KEYS[2], ARGV[2], ARGV[1])
return 1
