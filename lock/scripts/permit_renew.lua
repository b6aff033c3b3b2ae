-- permit_renew.lua: the watchdog's batch renewal of Semaphore permits. Each
-- permit is renewed on its own; others' leases run out if their holders die.
--
-- KEYS[1..n]  semaphores' sorted sets, all in one hash slot
-- ARGV[1]     lease in milliseconds
-- ARGV[1+i]   the holder member for KEYS[i]
--
-- Returns an array: 1 where the permit was renewed, 0 where it is gone.
local lease = tonumber(ARGV[1])
local now = now_ms()
local out = {}
for i = 1, #KEYS do
  local score = redis.call('zscore', KEYS[i], ARGV[i + 1])
  if score and tonumber(score) > now then
    redis.call('zadd', KEYS[i], now + lease, ARGV[i + 1])
    if redis.call('pttl', KEYS[i]) < lease then
      redis.call('pexpire', KEYS[i], lease)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
