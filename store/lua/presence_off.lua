-- presence_off.lua: end a user's announced presence if no device is left.
-- KEYS[1] ns:rt:{user} (connection -> node)   KEYS[2] ns:pr:{user}
-- ARGV: nodes known dead (their routes do not count)
-- Returns 1 when the presence was announced and is now ended (the caller
-- publishes presence.offline), 0 when a device on a live node remains or
-- nobody had announced it. Atomic with the arriving node's SET NX: either
-- that SET sees the key (no new online) or this sees its route (no offline).
local dead = {}
for _, n in ipairs(ARGV) do dead[n] = true end
local routes = redis.call('HVALS', KEYS[1])
for _, node in ipairs(routes) do
  if not dead[node] then return 0 end
end
return redis.call('DEL', KEYS[2])
