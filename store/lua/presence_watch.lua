-- presence_watch.lua: the users one user watches the presence of, counted
-- once across its connections and nodes (IM_PRESENCE_SUBS_MAX).
-- KEYS[1] ns:pw:{watcher}   hash: watched user -> nodes holding it (space-separated)
-- KEYS[2] ns:pwn:{watcher}  hash: node -> unix s its entries lapse unless renewed
-- ARGV: op (add | restore | count | del | renew), node, now, lease_s, cap, n dead,
--       the n dead nodes, then the watched users.
-- add: forgets the entries of dead or lapsed nodes, then adds the users, or
-- none of them when the watcher would watch more than cap: {1|0, count}.
-- restore: add without the cap. count: forgets as add does, {1, count}. del: {1, count}. renew: {0, 0} when the
-- node's lease is gone (the caller restores its entries), else {1, count}.
local op, me = ARGV[1], ARGV[2]
local now, lease, cap = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local first = 7 + tonumber(ARGV[6])

local function has(list, node)
  return string.find(' ' .. list .. ' ', ' ' .. node .. ' ', 1, true) ~= nil
end

local function set_without(field, list, gone)
  local keep = {}
  for n in string.gmatch(list, '%S+') do
    if not gone[n] then keep[#keep + 1] = n end
  end
  if #keep == 0 then
    redis.call('HDEL', KEYS[1], field)
  else
    local rest = table.concat(keep, ' ')
    if rest ~= list then redis.call('HSET', KEYS[1], field, rest) end
  end
end

local function keep_alive()
  redis.call('HSET', KEYS[2], me, now + lease)
  redis.call('EXPIRE', KEYS[1], lease)
  redis.call('EXPIRE', KEYS[2], lease)
end

if op == 'renew' then
  if redis.call('HEXISTS', KEYS[2], me) == 0 then return {0, 0} end
  keep_alive()
  return {1, redis.call('HLEN', KEYS[1])}
end

if op == 'del' then
  local mine = {[me] = true}
  for i = first, #ARGV do
    local list = redis.call('HGET', KEYS[1], ARGV[i])
    if list then set_without(ARGV[i], list, mine) end
  end
  local n = redis.call('HLEN', KEYS[1])
  if n == 0 then redis.call('DEL', KEYS[2]) end
  return {1, n}
end

-- add / restore: the entries of nodes named dead, or whose lease lapsed, go first
local named = {}
for i = 7, first - 1 do named[ARGV[i]] = true end
local gone, any = {}, false
local leases = redis.call('HGETALL', KEYS[2])
for i = 1, #leases, 2 do
  local n = leases[i]
  if n ~= me and (named[n] or tonumber(leases[i + 1]) <= now) then
    gone[n] = true
    any = true
    redis.call('HDEL', KEYS[2], n)
  end
end
if any then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do set_without(all[i], all[i + 1], gone) end
end

if op == 'count' then return {1, redis.call('HLEN', KEYS[1])} end
if op == 'add' then
  local new, seen = 0, {}
  for i = first, #ARGV do
    local u = ARGV[i]
    if not seen[u] then
      seen[u] = true
      if redis.call('HEXISTS', KEYS[1], u) == 0 then new = new + 1 end
    end
  end
  local count = redis.call('HLEN', KEYS[1])
  if count + new > cap then return {0, count} end
end
for i = first, #ARGV do
  local u = ARGV[i]
  local list = redis.call('HGET', KEYS[1], u)
  if not list then
    redis.call('HSET', KEYS[1], u, me)
  elseif not has(list, me) then
    redis.call('HSET', KEYS[1], u, list .. ' ' .. me)
  end
end
keep_alive()
return {1, redis.call('HLEN', KEYS[1])}
