-- deliver.lua: put one 1:1 message in one user's offline store, conversation
-- list and (for the receiver) unread counters, atomically.
-- KEYS[1] offline zset      (score = mid, member = encoded message)
-- KEYS[2] offline meta hash (floor: the zset is complete for mids above it)
-- KEYS[3] unread hash       (conv -> count, '*' -> total)
-- KEYS[4] unread mids zset of this conversation
-- KEYS[5] conversations zset (conv -> last mid)
-- KEYS[6] last message hash  (conv -> encoded message)
-- ARGV[1] mid   ARGV[2] encoded message   ARGV[3] conv
-- ARGV[4] '1' to count it as unread      ARGV[5] offline cap (entries)
-- ARGV[6] oldest mid kept (age cap)      ARGV[7] unread cap per conv
-- ARGV[8] conversations cap              ARGV[9] key TTL seconds
-- ARGV[10] '0' to leave the conversation list alone (group messages: a
--          group's row is built from the group's own state)
-- ARGV[11] what the conversation list keeps as the last message ('' : ARGV[2])
-- Returns 1 if the message was new to this user, 0 if it was already there
-- (a retried send: nothing is counted twice).
local mid = tonumber(ARGV[1])
local function fmt(n) return string.format('%.0f', n) end

if redis.call('EXISTS', KEYS[2]) == 0 then
  -- A new or lost store: it can only vouch for what arrives from now on.
  redis.call('HSET', KEYS[2], 'floor', fmt(mid - 1))
end
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

if ARGV[4] == '1' then
  redis.call('ZADD', KEYS[4], mid, ARGV[1])
  if redis.call('ZCARD', KEYS[4]) > tonumber(ARGV[7]) then
    redis.call('ZREMRANGEBYRANK', KEYS[4], 0, 0)
  end
  local count = redis.call('ZCARD', KEYS[4])
  local before = tonumber(redis.call('HGET', KEYS[3], ARGV[3]) or '0')
  redis.call('HSET', KEYS[3], ARGV[3], count)
  redis.call('HINCRBY', KEYS[3], '*', count - before)
  redis.call('EXPIRE', KEYS[4], ARGV[9])
end

if ARGV[10] == '0' then
  return 1
end
local last = redis.call('ZSCORE', KEYS[5], ARGV[3])
if not last or tonumber(last) < mid then
  redis.call('ZADD', KEYS[5], mid, ARGV[3])
  redis.call('HSET', KEYS[6], ARGV[3], ARGV[11] ~= '' and ARGV[11] or ARGV[2])
end
local convs = redis.call('ZCARD', KEYS[5])
if convs > tonumber(ARGV[8]) then
  -- Forget the oldest conversations; their unread leaves the total with them.
  for _, conv in ipairs(redis.call('ZRANGE', KEYS[5], 0, convs - tonumber(ARGV[8]) - 1)) do
    local gone = tonumber(redis.call('HGET', KEYS[3], conv) or '0')
    redis.call('HDEL', KEYS[3], conv)
    redis.call('HINCRBY', KEYS[3], '*', -gone)
    redis.call('HDEL', KEYS[6], conv)
    redis.call('ZREM', KEYS[5], conv)
  end
end
return 1
