-- deliver.lua: put one 1:1 message in one user's offline store, conversation
-- list and (for the receiver) unread mids, atomically.
-- KEYS[1] offline zset      (score = mid, member = encoded message)
-- KEYS[2] offline meta hash (floor: the zset is complete for mids above it)
-- KEYS[3] inbox meta hash   ('~' once rebuilt from MongoDB: the inbox keys are
--                            complete; 'v' bumped by an erasure meanwhile)
-- KEYS[4] unread zset       (score 0, member = conv .. '|' .. 16-digit mid)
-- KEYS[5] conversations zset (conv -> last mid)
-- KEYS[6] last message hash  (conv -> encoded message)
-- ARGV[1] mid   ARGV[2] encoded message   ARGV[3] conv
-- ARGV[4] '1' to count it as unread      ARGV[5] offline cap (entries)
-- ARGV[6] oldest mid kept (age cap)      ARGV[7] unread cap per conv
-- ARGV[8] conversations cap              ARGV[9] offline keys' TTL seconds
-- ARGV[10] '0' to leave the conversation list alone (group messages: a
--          group's row is built from the group's own state)
-- ARGV[11] what the conversation list keeps as the last message ('' : ARGV[2])
-- ARGV[12] the inbox keys' TTL seconds (KEYS[3..6], refreshed together)
-- ARGV[13] the unread member of this message
-- The inbox keys are written whether or not they are complete: every write
-- here only adds (a member, a later last message), so a rebuild from MongoDB
-- merged with them later loses nothing; only the rebuild marks them complete.
-- Returns 1 if the message was new to this user, 0 if it was already there
-- (a retried send: nothing is counted twice).
local mid = tonumber(ARGV[1])
local function fmt(n) return string.format('%.0f', n) end

if redis.call('HEXISTS', KEYS[2], 'floor') == 0 then
  -- A new or lost store: it can only vouch for what arrives from now on.
  redis.call('HSET', KEYS[2], 'floor', fmt(mid - 1))
end
-- A copy offline_fill.lua put here from MongoDB (the same bytes and a
-- trailing space) gives way: the delivery is new all the same.
redis.call('ZREM', KEYS[1], ARGV[2] .. ' ')
local added = redis.call('ZADD', KEYS[1], mid, ARGV[2])

-- Trim by age, then by count; the floor rises to the highest mid removed.
local floor = tonumber(redis.call('HGET', KEYS[2], 'floor'))
local old = redis.call('ZREVRANGEBYSCORE', KEYS[1], '(' .. ARGV[6], '-inf',
                       'WITHSCORES', 'LIMIT', 0, 1)
if #old > 0 then
  floor = math.max(floor, tonumber(old[2]))
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[6])
end
local cap = tonumber(ARGV[5])
local n = redis.call('ZCARD', KEYS[1])
if n > cap then
  local edge = redis.call('ZRANGE', KEYS[1], n - cap - 1, n - cap - 1, 'WITHSCORES')
  floor = math.max(floor, tonumber(edge[2]))
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - cap - 1)
end
redis.call('HSET', KEYS[2], 'floor', fmt(floor))
redis.call('EXPIRE', KEYS[1], ARGV[9])
redis.call('EXPIRE', KEYS[2], ARGV[9])

if added == 0 then
  return 0
end

local conv = ARGV[3]
if ARGV[4] == '1' then
  redis.call('ZADD', KEYS[4], 0, ARGV[13])
  local lo, hi = '[' .. conv .. '|', '(' .. conv .. '|:'
  if redis.call('ZLEXCOUNT', KEYS[4], lo, hi) > tonumber(ARGV[7]) then
    redis.call('ZREM', KEYS[4], redis.call('ZRANGEBYLEX', KEYS[4], lo, hi, 'LIMIT', 0, 1)[1])
  end
end

if ARGV[10] ~= '0' then
  local last = redis.call('ZSCORE', KEYS[5], conv)
  if not last or tonumber(last) < mid then
    redis.call('ZADD', KEYS[5], mid, conv)
    redis.call('HSET', KEYS[6], conv, ARGV[11] ~= '' and ARGV[11] or ARGV[2])
  end
  local convs = redis.call('ZCARD', KEYS[5])
  if convs > tonumber(ARGV[8]) then
    -- Forget the oldest conversations, their unread with them.
    for _, gone in ipairs(redis.call('ZRANGE', KEYS[5], 0, convs - tonumber(ARGV[8]) - 1)) do
      redis.call('ZREMRANGEBYLEX', KEYS[4], '[' .. gone .. '|', '(' .. gone .. '|:')
      redis.call('HDEL', KEYS[6], gone)
      redis.call('ZREM', KEYS[5], gone)
    end
  end
end
if ARGV[4] == '1' or ARGV[10] ~= '0' then
  for i = 3, 6 do redis.call('EXPIRE', KEYS[i], ARGV[12]) end
end
return 1
