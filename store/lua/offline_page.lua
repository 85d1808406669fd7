-- offline_page.lua: one page of the offline store, with its floor.
-- KEYS[1] offline zset   KEYS[2] offline meta hash
-- ARGV[1] since (exclusive)   ARGV[2] how many
-- Returns {floor or false, 'x' (how many erasures the store has seen:
-- recalls, deletions; '' none), member, score, member, score, ...}; floor
-- false means the store cannot vouch for anything (new, expired or lost).
local floor = redis.call('HGET', KEYS[2], 'floor')
local out = {floor or false, redis.call('HGET', KEYS[2], 'x') or ''}
if not floor then return out end
local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf',
                        'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
for i = 1, #rows do out[#out + 1] = rows[i] end
return out
