-- lease_renew.lua: extend a node's lease on its number if it still holds it.
-- KEYS[1] the lease key of the node's number
-- ARGV[1] the node's lease token   ARGV[2] lease ttl (seconds)
-- Returns 1 if renewed, 0 if the key is gone (Redis lost its data: the caller
-- may take it again with SET NX), -1 if another node holds the number now.
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
if not holder then
  return 0
end
return -1
