-- fair_alive.lua: the watchdog's batch renewal of our waiters' places in
-- FairMutex lines: it moves each waiter's liveness deadline (see fairlib.lua,
-- KEYS[5]) and never touches Redisson's deadlines.
--
-- KEYS        for each place in turn: the line's liveness hash
--             "seckillguard_fair_alive:{<name>}" and its deadlines
--             "redisson_lock_timeout:{<name>}"; all in one hash slot
-- ARGV[1]     how long a place stays without renewal, in milliseconds
-- ARGV[1+i]   the owner field of the i-th place
--
-- Returns an array: 1 where the place was renewed, 0 where it is gone
-- (given away as stale, or purged while this process stalled).
local timeout = tonumber(ARGV[1])
local now = now_ms()
local out = {}
for i = 1, #KEYS / 2 do
  local alive, deadlines, me = KEYS[2 * i - 1], KEYS[2 * i], ARGV[i + 1]
  local v = redis.call('hget', alive, me)
  local wait = v and string.match(v, '^%-?%d+:(%d+)$')
  if wait and redis.call('zscore', deadlines, me) then
    redis.call('hset', alive, me, (now + timeout) .. ':' .. wait)
    if redis.call('pttl', alive) < timeout then
      redis.call('pexpire', alive, timeout)
    end
    out[i] = 1
  else
    if v then redis.call('hdel', alive, me) end
    out[i] = 0
  end
end
return out
