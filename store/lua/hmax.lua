-- hmax.lua: raise a hash field to a value; it never moves back.
-- KEYS[1] hash   ARGV[1] field   ARGV[2] value
-- Returns the field's value now.
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1')
if tonumber(ARGV[2]) > cur then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return tonumber(ARGV[2])
end
return cur
