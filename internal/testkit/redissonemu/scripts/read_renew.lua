-- read_renew.lua: the lock watchdog's renewal of a Java process's read
-- holds: the timeout keys of this reader's own levels, then the hash.
--
-- KEYS[1]  the hash
-- KEYS[2]  the key prefix "{<name>}"
-- ARGV[1]  lease (ms)
-- ARGV[2]  the reader's field
--
-- Returns 1 renewed, 0 the reader holds no level any more.
local levels = tonumber(redis.call('hget', KEYS[1], ARGV[2]) or 0)
if levels == 0 then
  return 0
end
for i = 1, levels do
  redis.call('pexpire', KEYS[2] .. ':' .. ARGV[2] .. ':rwlock_timeout:' .. i, ARGV[1])
end
redis.call('pexpire', KEYS[1], ARGV[1])
return 1
