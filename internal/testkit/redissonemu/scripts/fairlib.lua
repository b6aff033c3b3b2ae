-- fairlib.lua: put in front of the fair-lock scripts. KEYS[2] is the line
-- (a list of owner fields, first waiter at the head), KEYS[3] the waiters'
-- deadlines (a sorted set, field -> ms of the Java client's clock).

-- drop_stale_heads removes waiters from the head of the line while their
-- deadline is not after now; it stops at the first live one, and at a head
-- that has no deadline. Waiters further back are not looked at.
local function drop_stale_heads(now)
  while true do
    local head = redis.call('lindex', KEYS[2], 0)
    if not head then return end
    local due = redis.call('zscore', KEYS[3], head)
    if not due or tonumber(due) > now then return end
    redis.call('zrem', KEYS[3], head)
    redis.call('lpop', KEYS[2])
  end
end
