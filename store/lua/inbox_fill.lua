-- inbox_fill.lua: merge a rebuild from MongoDB into one user's inbox keys and
-- mark them complete.
-- KEYS[1] inbox meta hash   KEYS[2] unread zset   KEYS[3] conversations zset
-- KEYS[4] last message hash (as deliver.lua's KEYS[3..6])
-- ARGV[1] the meta hash's 'v' when the rebuild began reading MongoDB ('' none)
-- ARGV[2] the inbox keys' TTL seconds   ARGV[3] conversations cap
-- ARGV[4] unread cap per conv
-- ARGV[5..] per conversation: conv, last mid, encoded last message, the
--   unread member of its read mark ('' : none), n, then its n unread members
-- Merged, never replacing: what deliveries wrote since the keys expired
-- stays (a later last message, unread mids MongoDB did not have yet); unread
-- mids up to the read mark go, and up to a read made since the rebuild began
-- (read.lua's 'r|' .. conv field: MongoDB's mark may predate it). An erasure
-- since the rebuild began ('v' moved) makes it start over: returns 0.
-- Returns 1 once complete.
local function refresh() for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ARGV[2]) end end
if redis.call('HEXISTS', KEYS[1], '~') == 1 then
  refresh()
  return 1  -- another rebuild got there first
end
if (redis.call('HGET', KEYS[1], 'v') or '') ~= ARGV[1] then
  return 0
end
local cap = tonumber(ARGV[4])
local i = 5
while i <= #ARGV do
  local conv, mid, last, upto, n = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3],
                                    tonumber(ARGV[i + 4])
  local lo, hi = '[' .. conv .. '|', '(' .. conv .. '|:'
  local cur = redis.call('ZSCORE', KEYS[3], conv)
  if not cur or tonumber(cur) < mid then
    redis.call('ZADD', KEYS[3], mid, conv)
    redis.call('HSET', KEYS[4], conv, last)
  end
  for j = i + 5, i + 4 + n do
    redis.call('ZADD', KEYS[2], 0, ARGV[j])
  end
  local since = redis.call('HGET', KEYS[1], 'r|' .. conv)
  if since and (upto == '' or since > upto) then
    upto = since
  end
  if upto ~= '' then
    redis.call('ZREMRANGEBYLEX', KEYS[2], lo, '[' .. upto)
  end
  local over = redis.call('ZLEXCOUNT', KEYS[2], lo, hi) - cap
  if over > 0 then
    for _, m in ipairs(redis.call('ZRANGEBYLEX', KEYS[2], lo, hi, 'LIMIT', 0, over)) do
      redis.call('ZREM', KEYS[2], m)
    end
  end
  i = i + 5 + n
end
local keep = tonumber(ARGV[3])
local convs = redis.call('ZCARD', KEYS[3])
if convs > keep then
  for _, gone in ipairs(redis.call('ZRANGE', KEYS[3], 0, convs - keep - 1)) do
    redis.call('ZREMRANGEBYLEX', KEYS[2], '[' .. gone .. '|', '(' .. gone .. '|:')
    redis.call('HDEL', KEYS[4], gone)
    redis.call('ZREM', KEYS[3], gone)
  end
end
redis.call('DEL', KEYS[1])  -- fields an older version kept here (counts) go too
redis.call('HSET', KEYS[1], '~', 1)
refresh()
return 1
