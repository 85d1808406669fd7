-- group_numbers.lua: merge groups' numbers into their shard of the summary.
-- KEYS[1] a shard hash: group -> 'ok,seq,lastmid,rdmid,rc' (rc: recalled seqs,
--         '.'-joined, newest last)
-- ARGV[1] the hash's TTL (s), refreshed   ARGV[2] recalled seqs kept
-- then 6 per group: group, ok ('1': from a complete source), seq, lastmid,
--         rdmid, recalled seqs ('.'-joined, or '')
-- Numbers only move forward and recalled seqs only join, so writers and
-- fills from the groups' states may run in any order. An entry is complete
-- ('ok' 1) once any complete source was merged into it; it stays so, as every
-- later message of the group is merged too (or its send failed).
local keep = tonumber(ARGV[2])
local function later(a, b)
  if tonumber(a) > tonumber(b) then return a end
  return b
end
for i = 3, #ARGV, 6 do
  local g = ARGV[i]
  local ok, seq, lastmid, rdmid, rc = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4],
      ARGV[i + 5]
  local cur = redis.call('HGET', KEYS[1], g)
  if cur then
    local cok, cseq, clast, crd, crc = string.match(cur, '^(%d),(%d+),(%d+),(%d+),(.*)$')
    if cok then
      if cok == '1' then ok = '1' end
      seq, lastmid, rdmid = later(seq, cseq), later(lastmid, clast), later(rdmid, crd)
      local seen, seqs = {}, {}
      for s in string.gmatch(crc, '[^.]+') do seen[s] = true; seqs[#seqs + 1] = s end
      for s in string.gmatch(rc, '[^.]+') do
        if not seen[s] then seen[s] = true; seqs[#seqs + 1] = s end
      end
      while #seqs > keep do table.remove(seqs, 1) end
      rc = table.concat(seqs, '.')
    end
  end
  redis.call('HSET', KEYS[1], g, ok .. ',' .. seq .. ',' .. lastmid .. ',' .. rdmid .. ',' .. rc)
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
