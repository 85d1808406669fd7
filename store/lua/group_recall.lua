-- group_recall.lua: a group message was recalled.
-- KEYS[1] group state hash (see group_state.lua)
-- ARGV[1] seq   ARGV[2] mid   ARGV[3] tombstone frame   ARGV[4] recalled seqs kept
-- The seq joins the state's 'rc' list (comma-separated, newest last, at most
-- ARGV[4]): members' unread leaves it out. The state's last message becomes
-- the tombstone if it was this one. Only on a complete state ('ok'): a
-- missing one is rebuilt from MongoDB, where the recall is already written.
if redis.call('HGET', KEYS[1], 'ok') ~= '1' then
  return 0
end
local rc = redis.call('HGET', KEYS[1], 'rc') or ''
local seqs = {}
for s in string.gmatch(rc, '[^,]+') do
  if s == ARGV[1] then return 1 end
  seqs[#seqs + 1] = s
end
seqs[#seqs + 1] = ARGV[1]
local keep = tonumber(ARGV[4])
while #seqs > keep do table.remove(seqs, 1) end
redis.call('HSET', KEYS[1], 'rc', table.concat(seqs, ','))
if redis.call('HGET', KEYS[1], 'lastmid') == ARGV[2] then
  redis.call('HSET', KEYS[1], 'last', ARGV[3])
end
return 1
