-- news_mark.lua: a member's index of its groups with news (read-diffused
-- messages), written when one of its groups has new messages.
-- KEYS[1] the member's index (sorted set: group -> score, a mid's time in ms;
--         '~' once seeded: -1 while being seeded, 0 once complete)
-- ARGV pairs: score, group. Only an index that exists is written (a member
-- that never synced has none: its first sync reads all its groups); a score
-- only rises.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 1, #ARGV, 2 do
  redis.call('ZADD', KEYS[1], 'GT', ARGV[i], ARGV[i + 1])
end
return 1
