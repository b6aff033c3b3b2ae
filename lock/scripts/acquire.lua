-- acquire.lua: take or re-enter a reentrant lock in Redisson's RLock layout and
-- issue a fencing token on the first acquisition.
--
-- KEYS[1]  the lock: a hash, field "<clientUUID>:<ownerID>" -> hold count
-- KEYS[2]  the token counter "redisson_lock_token:{<name>}" (a string with an
--          idle expiry: see issue_token in lib.lua)
-- ARGV[1]  lease in milliseconds (0 = leave the expiry as it is; re-entries of
--          fixed-lease holds keep their original deadline)
-- ARGV[2]  the owner field
-- ARGV[3]  the hold count the owner believes it has before this call (0 for a
--          first acquisition). Comparing it with the stored count makes the
--          script idempotent: a resent call whose first copy was applied (its
--          reply lost) is recognised instead of counting twice.
-- ARGV[4]  how many tokens a first acquisition reserves (default 1)
-- ARGV[5]  the token counter's idle expiry in milliseconds, "0" for none
--          (a first acquisition only)
-- KEYS[3]  optional, for a re-entry that fixes the lease (WithLease) of a
--          hold the watchdog renewed: the mark "seckillguard_fixed_lease:{<name>}",
--          set to the owner field with the lock's new expiry, so that a
--          renewal already on its way does not stretch it (see renew.lua)
--
-- Returns one integer (an array reply would cost Redis and the client more
-- on every acquisition; mutex.go decodes it):
--   token > 0   a first acquisition: the new fencing token (the n - 1 after
--               it are reserved for the owner)
--   0           a re-entry: the owner keeps its token
--   -1          a re-entry found the owner's hold gone (expired or
--               force-unlocked)
--   -3 - pttl   held by another owner; pttl as PTTL reports it (-1, no
--               expiry, gives -2; 0 and more give -3 and less)
local expected = tonumber(ARGV[3])
local lease = tonumber(ARGV[1])
local n = tonumber(ARGV[4] or 1)
local ttl = ARGV[5] or '0'

if expected == 0 then
  local pttl = redis.call('pttl', KEYS[1])
  if pttl == -2 then -- no such key: the lock is free
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1]) -- the string: no number to format
    -- the token rule and its reasons: issue_token in lib.lua
    return issue_token(KEYS[2], 0, n, ttl)
  end
  if redis.call('hget', KEYS[1], ARGV[2]) == '1' then
    -- The owner holds already: this acquisition was applied before and
    -- only its reply was lost, or the lock was handed over to the owner
    -- while it tried. Either way it gets a new token: the counter may stand
    -- at the end of a block whose tokens were given out (see issue_token),
    -- and a token nobody has seen costs nothing.
    redis.call('pexpire', KEYS[1], ARGV[1])
    return issue_token(KEYS[2], 0, n, ttl)
  end
  return -3 - pttl
end

local held = tonumber(redis.call('hget', KEYS[1], ARGV[2]) or 0)
if held == 0 then
  return -1
end
if held ~= expected + 1 then
  -- (held == expected + 1: applied before, only its reply was lost)
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
end
if lease > 0 then
  redis.call('pexpire', KEYS[1], lease)
  if KEYS[3] then redis.call('set', KEYS[3], ARGV[2], 'px', lease) end
end
return 0
