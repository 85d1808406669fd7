-- group_frames.lua: a group's newest read-diffused messages as the frames a
-- sync answers with, so a sync reads them here rather than from MongoDB.
-- KEYS[1] hash: seq -> the message's client frame (the bytes a push carries)
-- ARGV[1] the hash's TTL (s), refreshed by 'add'   ARGV[2] frames kept
-- ARGV[3] 'add' or 'recall'   then pairs: seq, frame
-- 'add': each frame is written; once the hash holds twice the number kept, the
-- lowest seqs go until that number is left (amortised: a sort per ARGV[2]
-- writes). 'recall': a frame is replaced only where one is kept (the
-- tombstone of a recalled message; one no longer kept stays out).
-- A seq missing here is read from MongoDB: nothing here is the only copy.
local keep = tonumber(ARGV[2])
if ARGV[3] == 'recall' then
  for i = 4, #ARGV, 2 do
    if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
      redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    end
  end
  return 1
end
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
local n = redis.call('HLEN', KEYS[1])
if n >= 2 * keep then
  local seqs = redis.call('HKEYS', KEYS[1])
  table.sort(seqs, function(a, b) return tonumber(a) < tonumber(b) end)
  for i = 1, n - keep do
    redis.call('HDEL', KEYS[1], seqs[i])
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
