-- sem_setpermits.lua: trySetPermits of RSemaphore and RPermitExpirableSemaphore:
-- the counter is created with the given permits only when it does not exist
-- (and the count sent on the channel).
--
-- KEYS[1]  the counter, KEYS[2] the channel
-- ARGV[1]  permits, ARGV[2] the publish command
--
-- Returns 1 set, 0 a counter was there already.
if redis.call('exists', KEYS[1]) == 1 then
  return 0
end
redis.call('set', KEYS[1], ARGV[1])
redis.call(ARGV[2], KEYS[2], ARGV[1])
return 1
