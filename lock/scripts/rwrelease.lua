-- rwrelease.lua: what read_release.lua and write_release.lua share, put in
-- front of them after rwlib.lua. Resent calls are harmless as in
-- release.lua.
--
-- release_level releases one level of the hold of field me, which its owner
-- believes to count expected levels before this call, on the lock KEYS[1]
-- (see rwlib.lua); publish is the publish command. It returns the hold
-- count left when the owner still holds (or -1 when it holds nothing, after
-- purging the dead holders), and nil when this was the owner's last level:
-- its field is gone then, and the caller frees or hands on the lock.
local function release_level(me, expected, publish)
  local held = tonumber(redis.call('hget', KEYS[1], me) or 0)
  if held == 0 then
    purge(publish)
    return -1
  end
  if expected > 1 and held == expected - 1 then
    return held
  end
  if expected > 1 and held > 1 then
    return redis.call('hincrby', KEYS[1], me, -1)
  end
  redis.call('hdel', KEYS[1], me)
  return nil
end
