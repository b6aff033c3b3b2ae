-- lib.lua: helpers shared by the scripts of this package. scripts.go puts
-- this text in front of each script that names it there (every script that
-- calls a helper below or reads TIME), so every script is still one
-- EVALSHA; the helpers are plain Lua 5.1 locals.
--
-- Scripts read the server's clock (TIME) before writing, which is safe only
-- when a script's effects are replicated rather than the script. Redis 7
-- always does; Redis 5 to 6.2 do by default but can be set not to
-- (lua-replicate-commands no), and replicate_commands switches it on for
-- the script either way.
if redis.replicate_commands then redis.replicate_commands() end

-- now_us returns the server's clock in microseconds. Deadlines and tokens come
-- from Redis TIME, never from client clocks.
local function now_us()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- now_ms returns the server's clock in milliseconds.
local function now_ms()
  return math.floor(now_us() / 1000)
end

-- issue_token stores and returns the next fencing token of the counter key:
-- max(stored + 1, server time in microseconds, floor). Strictly increasing
-- on one master, and still increasing after a failover to a replica that
-- missed the last tokens, unless clocks are skewed by more than the failover
-- took. Lua numbers are doubles: exact up to 2^53, written with %.0f, never
-- with tostring's %.14g.
--
-- n > 1 reserves the n - 1 tokens after the one returned: the counter is
-- left at token + n - 1, so every token issued later is above them, and the
-- caller may give them out itself while its hold lasts without another
-- command (a Mutex hands its lock over within its Client that way: see
-- transfer.lua). The clock still bounds them: tokens are microseconds, and
-- handing over takes longer than one.
--
-- The clock is nearly always ahead of the counter (a token per microsecond
-- is a million acquisitions a second), so the new value is written first
-- and the old one read by the same SET (its GET option, Redis 6.2): one
-- command instead of a GET and a SET. Only when the stored token is not
-- below the clock (a clock gone back, or a counter raised past it) is it
-- written again, from stored + 1.
--
-- ttl (milliseconds, a string; "0" for none) is the counter's idle expiry:
-- the counter lives at least ttl after the last token issued from it, and
-- at most ttl/8 longer, so a lock name nobody acquires for that long leaves
-- nothing behind. Setting an expiry costs Redis more than keeping one
-- (KEEPTTL), so a token sets it, to ttl + ttl/8, only when the counter is
-- new, when it was ahead of the clock (the second write below: a clock gone
-- back is when the counter matters most), or when the token falls into
-- another eighth of ttl than the stored one: tokens are microseconds of the
-- clock, so within one eighth the expiry set at its first token is still
-- at least ttl away. (An eighth whose first token came from a counter
-- ahead of the clock may end the counter that lead sooner; by then the
-- clock is past every token issued.) acquire.lua keeps a copy of this rule
-- inline (the hot path), and so must any change to it.
--
-- An expired counter cannot make tokens go backwards: the next token is the
-- clock again, above every token issued before unless the clock went back
-- by more than the counter was idle.
local function counter_expiry(ttl)
  return string.format('%.0f', tonumber(ttl) * 9 / 8)
end

-- set_counter writes value and returns what was stored; the expiry is set
-- when refresh is true, and otherwise by the rule above.
local function set_counter(counter, value, ttl, refresh)
  local v = string.format('%.0f', value)
  if ttl == '0' then
    return redis.call('set', counter, v, 'get')
  end
  if refresh then
    return redis.call('set', counter, v, 'px', counter_expiry(ttl), 'get')
  end
  local stored = redis.call('set', counter, v, 'keepttl', 'get')
  local e = ttl * 125 -- ttl/8 in microseconds (Lua reads the strings as numbers)
  if not stored or stored - stored % e ~= value - value % e then
    redis.call('pexpire', counter, counter_expiry(ttl))
  end
  return stored
end

local function issue_token(counter, floor, n, ttl)
  n = n or 1
  local token = now_us()
  if floor > token then token = floor end
  local stored = tonumber(set_counter(counter, token + n - 1, ttl, false) or 0)
  if stored >= token then
    token = stored + 1
    set_counter(counter, token + n - 1, ttl, true)
  end
  return token
end

-- raise_token makes the counter key at least t, so that every later token of
-- its lock is above t, and refreshes its idle expiry ttl (see set_counter).
local function raise_token(counter, t, ttl)
  if tonumber(redis.call('get', counter) or 0) < t then
    set_counter(counter, t, ttl, true)
  elseif ttl ~= '0' then
    redis.call('pexpire', counter, counter_expiry(ttl))
  end
end

-- foreign_listeners returns how many subscribers of channel are not Clients
-- of this package (Redisson's waiters): every Client's subscription to a
-- lock's channel comes with one to the channel's mark, which nobody
-- publishes on (see markChannel in names.go). mark "" (none: a Cluster
-- channel without a hash tag) counts none; numsub is "numsub", or
-- "shardnumsub" on Redis Cluster.
local function foreign_listeners(channel, mark, numsub)
  if mark == '' then return 0 end
  local n = redis.call('pubsub', numsub, channel, mark)
  return math.max(n[2] - n[4], 0)
end
