-- idem_finish.lua: the last step of an idempotent request. Stores its
-- answer, or drops its in-progress marker, only while the marker is still
-- this execution's own: an execution whose in-progress permit ran out may
-- have been overtaken by a newer one, whose marker or record it must not
-- overwrite.
--
-- KEYS[1]  the record
-- ARGV[1]  this execution's in-progress marker
-- ARGV[2]  the completed record to store, or "" to drop the marker
-- ARGV[3]  the record's time to live in milliseconds
--
-- Returns 1 when the record was stored or dropped, 0 when the marker was
-- not this execution's any more (nothing changed).
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('del', KEYS[1])
else
  redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
