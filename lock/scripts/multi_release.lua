-- multi_release.lua: release one level of each lock of a MultiLock that share
-- one hash slot, all at once, so that nobody sees some of them released and
-- others still held. Each lock is released as release.lua does.
--
-- KEYS        for each lock in turn: the lock hash, its unlock channel
--             "redisson_lock__channel:{<name>}"; all in one hash slot
-- ARGV[1]     the publish command: "publish", or "spublish" on Redis Cluster
-- ARGV        then for each lock in turn: the owner field, the hold count the
--             owner believes it has before this call
--
-- Returns an array: for each lock the hold count left (0 = free now), or -1
-- when the owner does not hold it.
local out = {}
for i = 1, #KEYS / 2 do
  local lock, channel = KEYS[2 * i - 1], KEYS[2 * i]
  local me, expected = ARGV[2 * i], tonumber(ARGV[2 * i + 1])
  local held = tonumber(redis.call('hget', lock, me) or 0)
  if held == 0 then
    out[i] = -1
  elseif expected > 1 and held == expected - 1 then
    out[i] = held
  elseif expected <= 1 or held <= 1 then
    redis.call('del', lock)
    redis.call(ARGV[1], channel, 0)
    out[i] = 0
  else
    out[i] = redis.call('hincrby', lock, me, -1)
  end
end
return out
