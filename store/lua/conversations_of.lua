-- conversations_of.lua: the rows of some conversations (pinned ones).
-- KEYS as conversations.lua   ARGV: the conversations
-- Returns {complete (1/0), conv, mid, unread, last, ...} for those in the list.
local complete = redis.call('HEXISTS', KEYS[1], '~')
local out = {complete}
for i = 1, #ARGV do
  local conv = ARGV[i]
  local mid = redis.call('ZSCORE', KEYS[3], conv)
  if mid then
    out[#out + 1] = conv
    out[#out + 1] = mid
    out[#out + 1] = redis.call('ZLEXCOUNT', KEYS[2], '[' .. conv .. '|', '(' .. conv .. '|:')
    out[#out + 1] = redis.call('HGET', KEYS[4], conv) or false
  end
end
return out
