-- group_edit.lua: a group message was edited.
-- KEYS[1] group state hash (see group_state.lua)   KEYS[2] kept frames hash
-- (see group_frames.lua)
-- ARGV[1] seq   ARGV[2] mid   ARGV[3] the new frame   ARGV[4] edited (unix ms)
-- The kept frame of the seq is dropped (a sync reads it from MongoDB, where
-- the edit is already written). The state's last message becomes the new
-- frame if it is this one, unless it is the tombstone of a recall or carries
-- a later edit (as rewrite.lua).
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('HGET', KEYS[1], 'lastmid') ~= ARGV[2] then
  return 0
end
local shown = redis.call('HGET', KEYS[1], 'last')
if shown then
  local ok, f = pcall(cjson.decode, shown)
  if ok and type(f) == 'table' then
    if f['recalled'] == true then return 0 end
    local ed = tonumber(f['edited'])
    if ed ~= nil and ed >= tonumber(ARGV[4]) then return 0 end
  end
end
redis.call('HSET', KEYS[1], 'last', ARGV[3])
return 1
