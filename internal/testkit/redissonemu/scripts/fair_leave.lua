-- fair_leave.lua: an RFairLock waiter that gave up (tryLock's wait ran out)
-- leaves the line; every waiter behind it has its deadline lowered by the
-- leaver's wait.
--
-- KEYS[1]  the line, KEYS[2] the deadlines
-- ARGV[1]  the owner field
-- ARGV[2]  the leaver's wait (ms), as in fair_acquire.lua
local behind = false
for _, w in ipairs(redis.call('lrange', KEYS[1], 0, -1)) do
  if behind then
    redis.call('zincrby', KEYS[2], -tonumber(ARGV[2]), w)
  elseif w == ARGV[1] then
    behind = true
  end
end
redis.call('zrem', KEYS[2], ARGV[1])
redis.call('lrem', KEYS[1], 0, ARGV[1])
return 0
