-- fair_leave.lua: a waiter that gives up leaves the FairMutex's line as
-- Redisson's does (every waiter behind it has its deadline lowered by the
-- leaver's wait); if the lock is free, the new first waiter is told to try.
-- If it is held and the waiter was first, the new first waiter is told the
-- holder's lease ("-<ms>", as fair_acquire.lua tells it): it learns that it
-- is first, and acts on the unlock of a Mutex of the name from then on (a
-- Mutex's release publishes on the Mutex's channel only).
--
-- KEYS[1..6]  see fairlib.lua
-- ARGV[1]     the owner field
-- ARGV[2]     the publish command: "publish", or "spublish" on Redis Cluster
-- ARGV[3]     "1" to also drop a first-level hold of the owner (an
--             acquisition whose reply was lost), "0" not to
-- ARGV[4]     the leaver's wait (ms), as fair_acquire.lua was given it
-- ARGV[5]     the Client's clock (ms)
--
-- Returns 1 when the owner had a place in the line, 0 when not.
local me = ARGV[1]
local had = redis.call('zscore', KEYS[3], me) and 1 or 0
local first = redis.call('lindex', KEYS[2], 0) == me
leave_line(me, tonumber(ARGV[4]))
local dropped = false
if ARGV[3] == '1' and redis.call('hget', KEYS[1], me) == '1' then
  redis.call('del', KEYS[1])
  dropped = true
end
local head = purge(tonumber(ARGV[5]))
if dropped then
  freed(ARGV[2], head)
  return had
end
if not head then return had end
local pttl = redis.call('pttl', KEYS[1])
if pttl == -2 then
  redis.call(ARGV[2], KEYS[4] .. ':' .. head, 0)
elseif first and pttl > 0 then
  redis.call(ARGV[2], KEYS[4] .. ':' .. head, '-' .. pttl)
end
return had
