-- group_rd.lua: a group's index of read-diffused messages, or its rebuild.
-- KEYS[1] sorted set: member seq -> score mid, one per read-diffused message,
--         the newest ARGV[2]; member '~' with score = the floor: every
--         read-diffused message with a mid above it is in the set. Without
--         '~' the set is not known complete and readers go to MongoDB.
-- ARGV[1] the set's TTL (s), refreshed   ARGV[2] entries kept
-- ARGV[3] the floor ('' for a write: the floor stays as it is; a number for a
--         rebuild from MongoDB, whose entries follow)
-- then pairs: mid, seq
for i = 4, #ARGV, 2 do
  redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
end
if ARGV[3] ~= '' then
  local cur = redis.call('ZSCORE', KEYS[1], '~')
  -- A rebuild that lost a race with a trim keeps the trim's higher floor.
  if not cur or tonumber(cur) < tonumber(ARGV[3]) then
    redis.call('ZADD', KEYS[1], ARGV[3], '~')
  end
end
local keep = tonumber(ARGV[2])
local over = redis.call('ZCARD', KEYS[1]) - keep - 1
if over > 0 then
  -- the oldest entries go ('~' scores lowest, so it is first: skip it); the
  -- floor rises to the newest mid dropped
  local gone = redis.call('ZRANGE', KEYS[1], 0, over, 'WITHSCORES')
  local floor = nil
  for i = 1, #gone, 2 do
    if gone[i] ~= '~' then
      redis.call('ZREM', KEYS[1], gone[i])
      floor = gone[i + 1]
    end
  end
  if floor and redis.call('ZSCORE', KEYS[1], '~') then
    redis.call('ZADD', KEYS[1], floor, '~')
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
