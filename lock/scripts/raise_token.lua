-- raise_token.lua: make fencing token counters at least a given token, so
-- that every later token of their locks is above it. A MultiLock whose locks
-- live on several nodes, and a RedLock, carry the largest token of their
-- parts; raising the others' counters to it keeps that token valid for each.
--
-- KEYS[1..n]  token counters "redisson_lock_token:{<name>}", one hash slot
-- ARGV[1]     the token
-- ARGV[2]     the counters' idle expiry in milliseconds, "0" for none
--
-- Returns n.
local t = tonumber(ARGV[1])
for i = 1, #KEYS do
  raise_token(KEYS[i], t, ARGV[2])
end
return #KEYS
