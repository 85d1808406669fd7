"""Every Lua script's keys share one Redis Cluster slot, and the sharded keys
spread (no server: ``key_slot`` is CRC16 as Redis computes it)."""

from __future__ import annotations

from redis.crc import key_slot

from store.keys import COUNTER_SHARDS, PULL_SHARDS, TIMELINE_SHARDS, Keys

K = Keys("t0123456789")
USERS = ["alice", "bob", "u-1", "x.y:z", "a" * 64]


def one_slot(*keys: str) -> bool:
    return len({key_slot(k.encode()) for k in keys}) == 1


def test_per_user_scripts_touch_one_slot() -> None:
    for u in USERS:
        # deliver.lua, read.lua, erase.lua, offline_ack/page.lua, conversations.lua,
        # inbox_fill.lua
        assert one_slot(K.offline(u), K.offline_meta(u), K.inbox_meta(u),
                        K.unread_mids(u), K.convs(u), K.conv_last(u))
        # read_seq.lua; dedup and routes share the user's slot too
        assert one_slot(K.user_groups(u), K.dedup(u, "cmid-1"), K.routes(u), K.following(u))


def test_counter_script_keys_share_the_post_shards_slot() -> None:
    for post in (1, 63, 64, 2**53 + 7, 123_456_789_012):
        assert one_slot(K.post_counts(post), K.dirty_counts(post % COUNTER_SHARDS))


def test_sharded_keys_spread_over_distinct_slots() -> None:
    """No one slot takes every counter change, timeline write or pull read."""
    assert len({key_slot(K.dirty_counts(s).encode()) for s in range(COUNTER_SHARDS)}) \
        == COUNTER_SHARDS
    assert len({key_slot(K.timeline_trims(s).encode()) for s in range(TIMELINE_SHARDS)}) \
        == TIMELINE_SHARDS
    assert len({key_slot(K.pullers_shard(s).encode()) for s in range(PULL_SHARDS)}) \
        == PULL_SHARDS
    users = [f"user{i}" for i in range(10_000)]
    per_shard: dict[str, int] = {}
    for u in users:
        per_shard[K.timeline_growth(u)] = per_shard.get(K.timeline_growth(u), 0) + 1
    assert len(per_shard) == TIMELINE_SHARDS
    assert max(per_shard.values()) < 2 * len(users) / TIMELINE_SHARDS


def test_a_users_timeline_keys_and_an_authors_pull_keys_share_their_shard() -> None:
    for u in USERS:
        sh = Keys.timeline_shard(u)
        assert one_slot(K.timeline_floors(u), K.timeline_growth(u), K.timeline_trims(sh))
        assert one_slot(K.pullers(u), K.fanouts_pending(u), K.pullers_shard(Keys.pull_shard(u)))
