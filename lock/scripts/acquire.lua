-- acquire.lua: take or re-enter a reentrant lock in Redisson's RLock layout and
-- issue a fencing token on the first acquisition.
--
-- KEYS[1]  the lock: a hash, field "<clientUUID>:<ownerID>" -> hold count
-- KEYS[2]  the token counter "redisson_lock_token:{<name>}" (a string, no TTL)
-- ARGV[1]  lease in milliseconds (0 = leave the expiry as it is; re-entries of
--          fixed-lease holds keep their original deadline)
-- ARGV[2]  the owner field
-- ARGV[3]  the hold count the owner believes it has before this call (0 for a
--          first acquisition). Comparing it with the stored count makes the
--          script idempotent: a resent call whose first copy was applied (its
--          reply lost) is recognised instead of counting twice.
--
-- Returns {1, token}  acquired; token is the new fencing token on a first
--                     acquisition and 0 on a re-entry (the owner keeps its own)
--         {0, pttl}   held by another owner; pttl as PTTL reports it
--         {-1, 0}     a re-entry found the owner's hold gone (expired or
--                     force-unlocked)
local expected = tonumber(ARGV[3])
local lease = tonumber(ARGV[1])

if expected == 0 then
  local pttl = redis.call('pttl', KEYS[1])
  if pttl == -2 then -- no such key: the lock is free
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], lease)
    -- token = max(stored + 1, server time in microseconds): strictly
    -- increasing on one master, and still increasing after a failover to a
    -- replica that missed the last tokens, unless clocks are skewed by more
    -- than the failover took. Lua numbers are doubles: exact up to 2^53,
    -- written with %.0f, never tostring's %.14g.
    if redis.replicate_commands then redis.replicate_commands() end
    local t = redis.call('time')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local token = tonumber(redis.call('get', KEYS[2]) or 0) + 1
    if now > token then token = now end
    redis.call('set', KEYS[2], string.format('%.0f', token))
    return {1, token}
  end
  if redis.call('hget', KEYS[1], ARGV[2]) == '1' then
    -- This acquisition was applied before; only its reply was lost.
    redis.call('pexpire', KEYS[1], lease)
    return {1, tonumber(redis.call('get', KEYS[2]) or 0)}
  end
  return {0, pttl}
end

local held = tonumber(redis.call('hget', KEYS[1], ARGV[2]) or 0)
if held == 0 then
  return {-1, 0}
end
if held ~= expected + 1 then
  -- (held == expected + 1: applied before, only its reply was lost)
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
end
if lease > 0 then redis.call('pexpire', KEYS[1], lease) end
return {1, 0}
