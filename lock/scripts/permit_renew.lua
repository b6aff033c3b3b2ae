-- permit_renew.lua: the watchdog's batch renewal of Semaphore permits. Each
-- permit is renewed on its own; others' leases run out if their holders die.
--
-- KEYS        for each permit in turn: the semaphore's counter and its
--             permits' set (see permitlib.lua); all in one hash slot
-- ARGV[1]     lease in milliseconds (the watchdog timeout); a counter of
--             this package is kept for as long again after the new lease
-- ARGV[1+i]   the holder member of the i-th permit
--
-- Returns an array: 1 where the permit was renewed, 0 where it is gone.
local lease = tonumber(ARGV[1])
local now = now_ms()
local out = {}
for i = 1, #KEYS / 2 do
  local counter, set, me = KEYS[2 * i - 1], KEYS[2 * i], ARGV[i + 1]
  local score = redis.call('zscore', set, me)
  if score and tonumber(score) > now and redis.call('exists', counter) == 1 then
    redis.call('zadd', set, now + lease, me)
    local ttl = redis.call('pttl', counter)
    if ttl >= 0 and ttl < 2 * lease then
      redis.call('pexpire', counter, 2 * lease)
      redis.call('pexpire', set, 2 * lease)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
