-- sem_acquire.lua: an RSemaphore acquisition: the counter holds the permits
-- left; taking n needs n of them.
--
-- KEYS[1]  the counter (a string key named after the semaphore)
-- ARGV[1]  permits to take
--
-- Returns 1 taken, 0 not enough left (or no counter yet).
local left = tonumber(redis.call('get', KEYS[1]) or -1)
if left < tonumber(ARGV[1]) then
  return 0
end
redis.call('decrby', KEYS[1], ARGV[1])
return 1
