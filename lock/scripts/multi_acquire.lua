-- multi_acquire.lua: take the locks of a MultiLock that share one hash slot,
-- all of them or none, in Redisson's RLock layout (each is a Mutex).
--
-- KEYS        for each lock in turn: the lock hash, its token counter
--             "redisson_lock_token:{<name>}"; all in one hash slot
-- ARGV[1]     the smallest token to issue (the largest token the MultiLock
--             already got from locks on other slots; 0 if none)
-- ARGV        then for each lock in turn: the owner field, the hold count the
--             owner believes it has (0: take it; more: re-enter it), the
--             lease in milliseconds. A re-entry only ever extends the lock's
--             expiry to it, never shortens it (a re-entry never weakens the
--             hold it enters); 0 leaves the expiry as it is
-- ARGV[#ARGV] last, the token counters' idle expiry in milliseconds, "0"
--             for none
--
-- One token t is issued for the whole set: above the floor, the clock, and
-- every counter of the set; every counter is raised to t. So t is a valid
-- fencing token for each of the locks, and every later token of any of them
-- is above it. Resent calls are harmless: locks the owner holds one more
-- level of than it believes are not counted twice.
--
-- Returns {1, t}        all taken
--         {0, pttl, i}  the i-th lock is held by another owner; nothing taken
--         {-1, 0, i}    the owner's hold of the i-th lock (a re-entry) is gone
local n = #KEYS / 2
local held = {}
for i = 1, n do
  local lock, me, expected = KEYS[2 * i - 1], ARGV[3 * i - 1], tonumber(ARGV[3 * i])
  held[i] = tonumber(redis.call('hget', lock, me) or 0)
  if expected > 0 then
    if held[i] == 0 then return {-1, 0, i} end
  elseif held[i] == 0 then
    local pttl = redis.call('pttl', lock)
    if pttl ~= -2 then return {0, pttl, i} end
  end
end

local floor = tonumber(ARGV[1])
for i = 1, n do
  local stored = tonumber(redis.call('get', KEYS[2 * i]) or 0) + 1
  if stored > floor then floor = stored end
end
local ttl = ARGV[#ARGV]
local t = issue_token(KEYS[2], floor, 1, ttl)
for i = 1, n do
  local lock, counter = KEYS[2 * i - 1], KEYS[2 * i]
  local me, expected, lease = ARGV[3 * i - 1], tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  if held[i] == 0 or held[i] == expected then
    redis.call('hincrby', lock, me, 1)
  end
  if lease > 0 and (expected == 0 or redis.call('pttl', lock) < lease) then
    redis.call('pexpire', lock, lease)
  end
  raise_token(counter, t, ttl)
end
return {1, t}
