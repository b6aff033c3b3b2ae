-- sem_release.lua: an RSemaphore release: the counter goes up and its new
-- value is the message on "redisson_sc:{<name>}".
--
-- KEYS[1]  the counter, KEYS[2] the channel
-- ARGV[1]  permits to give back, ARGV[2] the publish command
local now_left = redis.call('incrby', KEYS[1], ARGV[1])
redis.call(ARGV[2], KEYS[2], now_left)
return now_left
