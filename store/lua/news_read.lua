-- news_read.lua: the groups of a member with news since a point, from its index
-- (news_mark.lua), or false when the index is not complete; then it is opened
-- ('~' at -1: from now on marks land in it) for the caller to seed.
-- KEYS[1] the index   ARGV[1] the lowest score wanted   ARGV[2] TTL (s), refreshed
local floor = redis.call('ZSCORE', KEYS[1], '~')
if not floor then
  redis.call('ZADD', KEYS[1], -1, '~')
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  return false
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
if tonumber(floor) < 0 then
  return false
end
return redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], '+inf')
