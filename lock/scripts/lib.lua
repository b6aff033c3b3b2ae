-- lib.lua: helpers shared by every script of this package. scripts.go puts
-- this text in front of each script when it loads it, so every script is
-- still one EVALSHA; the helpers are plain Lua 5.1 locals.
--
-- Scripts read the server's clock (TIME) before writing. Redis 7 replicates
-- the effects of a script, not the script, so that is safe; older servers
-- need replicate_commands first.
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
local function issue_token(counter, floor)
  local token = tonumber(redis.call('get', counter) or 0) + 1
  local now = now_us()
  if now > token then token = now end
  if floor > token then token = floor end
  redis.call('set', counter, string.format('%.0f', token))
  return token
end

-- raise_token makes the counter key at least t, so that every later token of
-- its lock is above t.
local function raise_token(counter, t)
  if tonumber(redis.call('get', counter) or 0) < t then
    redis.call('set', counter, string.format('%.0f', t))
  end
end
