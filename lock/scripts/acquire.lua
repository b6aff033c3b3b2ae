-- acquire.lua: take or re-enter a reentrant lock in Redisson's RLock layout and
-- issue a fencing token on the first acquisition.
--
-- KEYS[1]  the lock: a hash, field "<clientUUID>:<ownerID>" -> hold count
-- KEYS[2]  the token counter "redisson_lock_token:{<name>}" (a string with an
--          idle expiry: see set_counter in lib.lua)
-- ARGV[1]  lease in milliseconds. A re-entry only ever extends the lock's
--          expiry to it, never shortens it (a re-entry never weakens the hold
--          it enters); 0 leaves the expiry as it is (a fixed-lease hold
--          re-entered without a lease keeps its deadline)
-- ARGV[2]  the owner field
-- ARGV[3]  the hold count the owner believes it has before this call ("0" for a
--          first acquisition). Comparing it with the stored count makes the
--          script idempotent: a resent call whose first copy was applied (its
--          reply lost) is recognised instead of counting twice.
-- ARGV[4]  the token counter's idle expiry in milliseconds, "0" for none
--          (a first acquisition only)
--
-- Returns one integer (an array reply would cost Redis and the client more
-- on every acquisition; mutex.go decodes it):
--   token > 0   a first acquisition: the new fencing token (the 15 after it
--               are reserved for the owner: tokenBlock in handover.go, a
--               number here because an argument costs Redis more to read)
--   0           a re-entry: the owner keeps its token
--   -1          a re-entry found the owner's hold gone (expired or
--               force-unlocked)
--   -3 - pttl   held by another owner; pttl as PTTL reports it (-1, no
--               expiry, gives -2; 0 and more give -3 and less)
--
-- This script is the uncontended Lock's, the one path whose Redis time
-- shows in every request, and is assembled without lib.lua: building its
-- helpers costs Lua more on every call than the work of a first
-- acquisition around them. It issues the token with an inline copy of
-- issue_token and set_counter (lib.lua: the rule and its reasons), which
-- TestToken_ScriptsApplyFencingNext and the counter expiry tests hold to
-- the same rule as every other kind's.
if redis.replicate_commands then redis.replicate_commands() end -- see lib.lua

if ARGV[3] == '0' then
  local pttl = redis.call('pttl', KEYS[1])
  if pttl == -2 then -- no such key: the lock is free
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
  elseif redis.call('hget', KEYS[1], ARGV[2]) ~= '1' then
    return -3 - pttl
  end
  -- Free, or the owner holds already: this acquisition was applied before
  -- and only its reply was lost, or the lock was handed over to the owner
  -- while it tried. Either way it gets a new token: the counter may stand
  -- at the end of a block whose tokens were given out (see issue_token),
  -- and a token nobody has seen costs nothing.
  redis.call('pexpire', KEYS[1], ARGV[1]) -- the string: no number to format
  local t = redis.call('time')
  local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = token + 15 -- the block: tokenBlock (16) in handover.go
  local ttl = ARGV[4]
  local stored
  if ttl == '0' then
    stored = redis.call('set', KEYS[2], string.format('%.0f', last), 'get')
  else
    stored = redis.call('set', KEYS[2], string.format('%.0f', last), 'keepttl', 'get')
    local e = ttl * 125 -- ttl/8 in microseconds (Lua reads the strings as numbers)
    if not stored or stored - stored % e ~= last - last % e then
      redis.call('pexpire', KEYS[2], string.format('%.0f', tonumber(ttl) * 9 / 8))
    end
  end
  stored = tonumber(stored or 0)
  if stored >= token then
    -- The counter is not behind the clock: count on from it.
    last = last + stored + 1 - token
    token = stored + 1
    if ttl == '0' then
      redis.call('set', KEYS[2], string.format('%.0f', last))
    else
      redis.call('set', KEYS[2], string.format('%.0f', last), 'px', string.format('%.0f', tonumber(ttl) * 9 / 8))
    end
  end
  return token
end

local expected = tonumber(ARGV[3])
local lease = tonumber(ARGV[1])
local held = tonumber(redis.call('hget', KEYS[1], ARGV[2]) or 0)
if held == 0 then
  return -1
end
if held ~= expected + 1 then
  -- (held == expected + 1: applied before, only its reply was lost)
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
end
if lease > 0 and redis.call('pttl', KEYS[1]) < lease then
  redis.call('pexpire', KEYS[1], lease)
end
return 0
