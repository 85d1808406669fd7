-- rewrite.lua: an edited message's new frame in one user's Redis view.
-- KEYS[1] offline zset   KEYS[2] conversations zset   KEYS[3] last message hash
-- KEYS[4] offline meta hash: 'x' counts the rewrite, so a fill of the offline
--         store from MongoDB read before the edit (offline_fill.lua) does not
--         put the old body back (as erase.lua)
-- ARGV[1] mid   ARGV[2] conv   ARGV[3] the new frame   ARGV[4] its preview (the
-- conversation list's last message)   ARGV[5] edited (unix ms)   ARGV[6] TTL s
-- A frame kept here is replaced unless it is a recalled message's tombstone
-- or carries a later edit (two edits, or an edit and a recall, may reach
-- Redis in either order: the tombstone and the newest edit win). The
-- conversation's last message is rewritten the same way when it is this one.
-- A group's row ('g:...') is the group state's, not this user's.
-- Returns 1 if the offline entry was rewritten, else 0.
local mid, conv, at = ARGV[1], ARGV[2], tonumber(ARGV[5])

local function replaceable(frame)
  local ok, f = pcall(cjson.decode, frame)
  if not ok or type(f) ~= 'table' then return true end
  if f['recalled'] == true then return false end
  local ed = tonumber(f['edited'])
  return ed == nil or ed < at
end

redis.call('HINCRBY', KEYS[4], 'x', 1)
if redis.call('TTL', KEYS[4]) < 0 then
  redis.call('EXPIRE', KEYS[4], ARGV[6])
end
local done = 0
local cur = redis.call('ZRANGEBYSCORE', KEYS[1], mid, mid)
if #cur > 0 and replaceable(cur[1]) then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], mid, mid)
  redis.call('ZADD', KEYS[1], mid, ARGV[3])
  done = 1
end
if string.sub(conv, 1, 2) ~= 'g:' then
  local last = redis.call('ZSCORE', KEYS[2], conv)
  if last and tonumber(last) == tonumber(mid) then
    local shown = redis.call('HGET', KEYS[3], conv)
    if not shown or replaceable(shown) then
      redis.call('HSET', KEYS[3], conv, ARGV[4])
    end
  end
end
return done
