-- group_state.lua: merge what is known of a group into its state hash.
-- KEYS[1] group state hash: seq, lastmid, last (encoded newest message), rdmid,
--         ok (set once the hash was filled from MongoDB: it is complete)
-- ARGV[1] seq   ARGV[2] lastmid   ARGV[3] encoded message with that mid (or '')
-- ARGV[4] rdmid (newest read-diffused mid, or 0)   ARGV[5] '1' if from MongoDB
-- ARGV[6] the hash's TTL (s), refreshed (a state that expired is rebuilt from
--         MongoDB: without 'ok' it is never taken as complete)
-- Every field only moves forward, so writers and a rebuild from MongoDB may
-- run in any order and the hash ends at the maximum of all of them.
local function bump(field, value)
  local cur = tonumber(redis.call('HGET', KEYS[1], field) or '-1')
  if tonumber(value) > cur then
    redis.call('HSET', KEYS[1], field, value)
    return true
  end
  return false
end
bump('seq', ARGV[1])
if bump('lastmid', ARGV[2]) and ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'last', ARGV[3])
end
bump('rdmid', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[6])
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[1], 'ok', '1')
end
return redis.call('HGET', KEYS[1], 'ok') or false
