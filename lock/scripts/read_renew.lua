-- read_renew.lua: the watchdog's batch renewal of RWMutex holds, read and
-- write: each has a lease of its own among the holders' leases (see
-- rwlib.lua). Renews only the holder's own lease, never the others': a
-- crashed reader's lease runs out even while other readers are renewed. A
-- read hold's timeout keys (Redisson's, see rwlib.lua) are renewed with it,
-- its own only, so a Redisson read unlock sees the live reader and not a
-- dead one.
--
-- KEYS        for each hold in turn: the lock hash, its readers' set
--             "seckillguard_rwlock_readers:{<name>}", and what the readers'
--             timeout keys start with ("{<name>}"); all in one hash slot
-- ARGV[1]     lease in milliseconds
-- ARGV[1+i]   the holder's field of the i-th hold (a reader's, or a writer's
--             "<...>:write")
--
-- Returns an array: 1 where the hold was renewed, 0 where it is gone.
local lease = tonumber(ARGV[1])
local now = now_ms()
local out = {}
for i = 1, #KEYS / 3 do
  local lock, readers, base, me = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], ARGV[i + 1]
  local levels = tonumber(redis.call('hget', lock, me) or 0)
  if levels > 0 and redis.call('zscore', readers, me) then
    redis.call('zadd', readers, now + lease, me)
    if string.sub(me, -6) ~= ':write' then
      for l = 1, levels do
        redis.call('set', base .. ':' .. me .. ':rwlock_timeout:' .. l, 1, 'px', lease)
      end
    end
    -- Each key lasts at least the new lease: the hash may have been kept
    -- alive by another holder (a write hold the watchdog renews) while the
    -- readers' set was not.
    if redis.call('pttl', lock) < lease then
      redis.call('pexpire', lock, lease)
    end
    if redis.call('pttl', readers) < lease then
      redis.call('pexpire', readers, lease)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
