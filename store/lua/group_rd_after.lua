-- group_rd_after.lua: a member's next read-diffused messages of a group, from
-- the group's index (group_rd.lua).
-- KEYS[1] the index   ARGV[1] after this mid   ARGV[2] the member's from_seq
-- (seqs up to it came before it joined)   ARGV[3] how many
-- Returns false when the index is not known complete above ARGV[1]; else
-- {mid, seq, mid, seq, ...} of the first ARGV[3] with a seq above ARGV[2].
local floor = redis.call('ZSCORE', KEYS[1], '~')
if not floor or tonumber(floor) > tonumber(ARGV[1]) then
  return false
end
local from, want = tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
local offset = 0
while #out < 2 * want do
  local got = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf', 'WITHSCORES',
                         'LIMIT', offset, 200)
  if #got == 0 then break end
  for i = 1, #got, 2 do
    if got[i] ~= '~' and tonumber(got[i]) > from and #out < 2 * want then
      out[#out + 1] = got[i + 1]
      out[#out + 1] = got[i]
    end
  end
  offset = offset + #got / 2
end
return out
