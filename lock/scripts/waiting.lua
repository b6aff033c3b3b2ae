-- waiting.lua: the watchdog's batch renewal of places in wait lines (a
-- FairMutex's queue, an RWMutex's waiting writers). A place is a member of a
-- sorted set whose score is the server time (ms) by which its owner must show
-- it is alive; whoever finds it past that time gives the place away.
--
-- KEYS        for each place in turn: the sorted set of deadlines, and a key
--             that lives as long as it (the line itself, or the set again);
--             all in one hash slot
-- ARGV[1]     how long a place stays without renewal, in milliseconds
-- ARGV[1+i]   the member of the i-th place
--
-- Returns an array: 1 where the place was renewed, 0 where it is gone.
local timeout = tonumber(ARGV[1])
local deadline = now_ms() + timeout
local out = {}
for i = 1, #KEYS / 2 do
  local set, also, me = KEYS[2 * i - 1], KEYS[2 * i], ARGV[i + 1]
  if redis.call('zscore', set, me) then
    redis.call('zadd', set, deadline, me)
    for _, k in ipairs({set, also}) do
      if redis.call('pttl', k) < timeout then
        redis.call('pexpire', k, timeout)
      end
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
