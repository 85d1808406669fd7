-- device_claim.lua: a connection takes its device's slot (core/devices.py).
-- KEYS[1] hash: connection ("node:id") -> "device|platform|slot|since ms"
-- ARGV[1] the connection   ARGV[2] device   ARGV[3] platform   ARGV[4] slot
-- ARGV[5] since (unix ms)   ARGV[6] the hash's TTL (s)
-- Every other connection holding the same slot, or of the same device, is
-- removed and returned: the caller closes them (4005). Atomic, so of two
-- connections claiming one slot at once on two nodes exactly one keeps it.
local out = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local conn, entry = all[i], all[i + 1]
  if conn ~= ARGV[1] then
    local device, _, held = string.match(entry, '^([^|]*)|([^|]*)|([^|]*)|')
    if held == ARGV[4] or device == ARGV[2] then
      redis.call('HDEL', KEYS[1], conn)
      out[#out + 1] = conn
    end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. '|' .. ARGV[3] .. '|' .. ARGV[4] .. '|' .. ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[6])
return out
