-- like_once.lua: a like's +1 or its unlike's -1 on a post's likes count, each
-- at most once however often a call is retried (a retry after `unavailable`
-- may find its first try's write done in MongoDB), and the -1 only for a
-- like whose +1 was counted. Each like row in MongoDB has a token; its +1
-- and -1 are marked under that token (KEYS[3], KEYS[4]).
-- KEYS[1] the post's counter hash   KEYS[2] its shard's dirty set (as counter.lua)
-- KEYS[3] the like's +1 mark        KEYS[4] its -1 mark (same hash tag)
-- ARGV[1] 1 or -1   ARGV[2] post id   ARGV[3] the hash's TTL (s)
-- ARGV[4] the marks' TTL (s)        ARGV[5] "1": the row says its +1 is counted
-- (then a +1 moves nothing, and a -1 moves whether or not its +1 mark is left)
-- Returns 1 moved now; 0 moved before (or, for -1, never counted: nothing to
-- take back); -1 for a +1 whose -1 came first: the like is being undone.
if tonumber(ARGV[1]) > 0 then
    if redis.call('EXISTS', KEYS[4]) == 1 then
        return -1
    end
    if ARGV[5] == '1' or not redis.call('SET', KEYS[3], '1', 'NX', 'EX', ARGV[4]) then
        return 0
    end
else
    if not redis.call('SET', KEYS[4], '1', 'NX', 'EX', ARGV[4]) then
        return 0
    end
    if ARGV[5] ~= '1' and redis.call('EXISTS', KEYS[3]) == 0 then
        return 0
    end
end
redis.call('HINCRBY', KEYS[1], 'l', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('SADD', KEYS[2], ARGV[2])
return 1
