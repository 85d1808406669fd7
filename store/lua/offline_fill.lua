-- offline_fill.lua: put a page of a user's MongoDB box into its offline store
-- and lower the floor to the page's start, so that the next sync from there
-- is answered from Redis (after a Redis loss the store vouches only for what
-- was delivered since; a client's cursor is older).
-- KEYS[1] offline zset   KEYS[2] offline meta hash
-- ARGV[1] since: the page holds every box entry after it, up to its last
-- ARGV[2] the meta hash's 'x' when the store was read before MongoDB ('' none)
-- ARGV[3] '1' if the page holds every entry MongoDB had after since (it was
--         not full), else '0'
-- ARGV[4] the page's last mid   ARGV[5] offline cap (entries)
-- ARGV[6] oldest mid kept (age cap)   ARGV[7] offline keys' TTL seconds
-- ARGV[8..] mid, encoded message pairs; each member is written with a
--   trailing space (still the same JSON): a delivery of that message still
--   to come (deliver.lua) replaces it and counts as new (unread, conversation
--   list), as if the fill had not been
-- Nothing is written when the store already vouches for since, when an
-- erasure came between the two reads ('x' moved: the page may hold a message
-- as it was before a recall), or when the page ends below the floor and MongoDB held
-- more (a hole between the two). A mid the store holds already keeps its
-- member (a recall's tombstone). Returns 1 if filled, else 0.
local function fmt(n) return string.format('%.0f', n) end
if (redis.call('HGET', KEYS[2], 'x') or '') ~= ARGV[2] then
  return 0
end
local since = tonumber(ARGV[1])
local floor = redis.call('HGET', KEYS[2], 'floor')
if floor and tonumber(floor) <= since then
  return 0
end
if ARGV[3] ~= '1' and (not floor or tonumber(ARGV[4]) < tonumber(floor)) then
  return 0
end
for i = 8, #ARGV, 2 do
  if redis.call('ZCOUNT', KEYS[1], ARGV[i], ARGV[i]) == 0 then
    redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1] .. ' ')
  end
end
-- Trimmed as deliver.lua trims: by age, then by count; the floor rises to
-- the highest mid removed.
local low = since
local old = redis.call('ZREVRANGEBYSCORE', KEYS[1], '(' .. ARGV[6], '-inf',
                       'WITHSCORES', 'LIMIT', 0, 1)
if #old > 0 then
  low = math.max(low, tonumber(old[2]))
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[6])
end
local cap = tonumber(ARGV[5])
local n = redis.call('ZCARD', KEYS[1])
if n > cap then
  local edge = redis.call('ZRANGE', KEYS[1], n - cap - 1, n - cap - 1, 'WITHSCORES')
  low = math.max(low, tonumber(edge[2]))
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - cap - 1)
end
redis.call('HSET', KEYS[2], 'floor', fmt(low))
redis.call('EXPIRE', KEYS[1], ARGV[7])
redis.call('EXPIRE', KEYS[2], ARGV[7])
return 1
