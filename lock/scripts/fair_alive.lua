-- fair_alive.lua: the watchdog's batch renewal of our waiters' places in
-- FairMutex lines: it moves each waiter's liveness deadline (see fairlib.lua,
-- KEYS[5]) and never touches Redisson's deadlines.
--
-- KEYS        for each place in turn: the line's liveness
--             "seckillguard_fair_alive:{<name>}", its waits
--             "seckillguard_fair_wait:{<name>}" and its deadlines
--             "redisson_lock_timeout:{<name>}"; all in one hash slot
-- ARGV[1]     how long a place stays without renewal, in milliseconds
-- ARGV[1+i]   the owner field of the i-th place
--
-- Returns an array: 1 where the place was renewed, 0 where it is gone
-- (given away as stale, or purged while this process stalled).
local timeout = tonumber(ARGV[1])
local now = now_ms()
local out = {}
for i = 1, #KEYS / 3 do
  local alive, waits, deadlines, me = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], ARGV[i + 1]
  if redis.call('zscore', deadlines, me) and redis.call('zscore', alive, me) then
    redis.call('zadd', alive, now + timeout, me)
    if redis.call('pttl', alive) < timeout then -- both keys have the same expiry
      redis.call('pexpire', alive, timeout)
      redis.call('pexpire', waits, timeout)
    end
    out[i] = 1
  else
    if redis.call('zrem', alive, me) == 1 then redis.call('hdel', waits, me) end
    out[i] = 0
  end
end
return out
