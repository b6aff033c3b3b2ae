-- waiting.lua: the watchdog's batch renewal of places in wait lines (a
-- FairMutex's queue, an RWMutex's waiting writers). A place is a member of a
-- sorted set whose score is the server time (ms) by which its owner must show
-- it is alive; whoever finds it past that time gives the place away.
--
-- KEYS[1..n]  the sorted sets, all in one hash slot
-- ARGV[1]     how long a place stays without renewal, in milliseconds
-- ARGV[1+i]   the member for KEYS[i]
--
-- Returns an array: 1 where the place was renewed, 0 where it is gone.
local deadline = now_ms() + tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  if redis.call('zscore', KEYS[i], ARGV[i + 1]) then
    redis.call('zadd', KEYS[i], deadline, ARGV[i + 1])
    if redis.call('pttl', KEYS[i]) < tonumber(ARGV[1]) then
      redis.call('pexpire', KEYS[i], ARGV[1])
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
