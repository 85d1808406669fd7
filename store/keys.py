"""Every Redis key the product uses, built here and nowhere else.

Keys of one user carry that user's id as the Redis Cluster hash tag
(``{alice}``), so a Lua script that touches one user's keys touches one slot.
Ids are validated against ``[A-Za-z0-9_.:-]{1,64}`` before they get here, so
they never contain braces. Every Lua script takes keys of one hash tag only.
"""

from __future__ import annotations

import zlib

__all__ = ["COUNTER_SHARDS", "GROUP_NUMBER_SHARDS", "PULL_SHARDS", "TIMELINE_SHARDS", "Keys"]

# Keys every user or post would otherwise share are split into shards, each
# its own hash tag (slot), so no single Redis Cluster node takes every
# timeline write or every counter change (docs/scaling.md: their cost at 10x).
COUNTER_SHARDS = 64  # post counters and their dirty sets, by post id
TIMELINE_SHARDS = 64  # timeline floors, growth and trims, by user
GROUP_NUMBER_SHARDS = 64  # groups' numbers (seq, last mid, ...) by group: a list of a
# user's groups reads at most this many hashes, whatever the number of groups
PULL_SHARDS = 16  # pulled authors and fan-outs under way, by author; a timeline read
# reads the shards of the authors it follows


class Keys:
    """Key builder for one namespace (``IM_NAMESPACE``)."""

    def __init__(self, namespace: str) -> None:
        self.ns = namespace

    # -- per user (hash tag = user id) ---------------------------------------
    def offline(self, user: str) -> str:
        """Sorted set: score = mid, member = encoded message."""
        return f"{self.ns}:off:{{{user}}}"

    def offline_meta(self, user: str) -> str:
        """Hash: ``floor`` = the zset is complete for mids above this."""
        return f"{self.ns}:offm:{{{user}}}"

    def inbox_meta(self, user: str) -> str:
        """Hash: ``~`` once the inbox keys (this, ``unread_mids``, ``convs``,
        ``conv_last``) were rebuilt from MongoDB and are complete; ``v`` counts
        reads and erasures made while they were not. The four expire together."""
        return f"{self.ns}:unr:{{{user}}}"

    def legacy_unread_mids(self, user: str, conv: str) -> str:
        """What a version before inbox TTLs kept per conversation: a sorted set
        of its unread mids (read once, when the user's inbox is first rebuilt)."""
        return f"{self.ns}:unm:{{{user}}}:{conv}"

    def unread_mids(self, user: str) -> str:
        """Sorted set of unread mids, every conversation's: score 0, member
        ``conv|<mid, 16 digits>`` (one conversation's are one lex range)."""
        return f"{self.ns}:unm:{{{user}}}"

    def convs(self, user: str) -> str:
        """Sorted set: conversation -> mid of its last message."""
        return f"{self.ns}:cv:{{{user}}}"

    def conv_last(self, user: str) -> str:
        """Hash: conversation -> encoded last message."""
        return f"{self.ns}:cvl:{{{user}}}"

    def dedup(self, user: str, cmid: str) -> str:
        """String: ``p:<mid>`` while a send is in flight, ``d:<mid>`` once acked."""
        return f"{self.ns}:dd:{{{user}}}:{cmid}"

    def sanctions(self, user: str) -> str:
        """Hash: ``ban`` -> unix time a ban ends, ``rev`` -> tokens issued before
        this unix time are refused."""
        return f"{self.ns}:san:{{{user}}}"

    def devices(self, user: str) -> str:
        """Hash: connection ("node:id") -> "device|platform|slot|since ms", for
        every connected device of the user (``device_claim.lua``)."""
        return f"{self.ns}:dev:{{{user}}}"

    def routes(self, user: str) -> str:
        """Hash: connection id -> node id, for every connected device."""
        return f"{self.ns}:rt:{{{user}}}"

    def presence(self, user: str) -> str:
        """String, while ``presence.online`` was the user's last presence event
        (set NX by the arriving device's node, deleted by whoever announces
        ``presence.offline``; same slot as the routes it is checked against)."""
        return f"{self.ns}:pr:{{{user}}}"

    def watched(self, user: str) -> str:
        """Hash: each user ``user`` watches the presence of -> the nodes whose
        connections of ``user`` watch it (space-separated); its length is what
        ``IM_PRESENCE_SUBS_MAX`` caps."""
        return f"{self.ns}:pw:{{{user}}}"

    def watch_leases(self, user: str) -> str:
        """Hash: node -> unix time its entries in ``watched(user)`` lapse unless
        the node renews them (a node that died stops counting)."""
        return f"{self.ns}:pwn:{{{user}}}"

    # -- groups (hash tag = "g:" + group id; per user: the user id) ------------
    def group_state(self, group: str) -> str:
        """Hash: seq, lastmid, last (encoded newest message), rdmid, ok."""
        return f"{self.ns}:gs:{{g:{group}}}"

    def group_rd(self, group: str) -> str:
        """Sorted set: the group's newest read-diffused messages (member seq, score
        mid) and ``~`` at the floor it is complete above (``group_rd.lua``)."""
        return f"{self.ns}:grd:{{g:{group}}}"

    def group_frames(self, group: str) -> str:
        """Hash: seq -> client frame of the group's newest read-diffused messages
        (``group_frames.lua``): what a sync answers with, not read from MongoDB."""
        return f"{self.ns}:grf:{{g:{group}}}"

    def group_numbers(self, group: str) -> str:
        """Hash (one of ``GROUP_NUMBER_SHARDS``, by group): group -> its numbers
        as ``ok,seq,lastmid,rdmid,recalled`` (``group_numbers.lua``)."""
        return self.group_numbers_shard(self.group_number_shard(group))

    def group_numbers_shard(self, shard: int) -> str:
        return f"{self.ns}:gn:{{gn:{shard}}}"

    @staticmethod
    def group_number_shard(group: str) -> int:
        return zlib.crc32(group.encode()) % GROUP_NUMBER_SHARDS

    def group_members(self, group: str) -> str:
        """Set of member ids, plus the marker ``~`` once complete."""
        return f"{self.ns}:gm:{{g:{group}}}"

    def user_groups(self, user: str) -> str:
        """Hash: group -> from_seq, ``r:<group>`` -> read seq, ``~`` once complete."""
        return f"{self.ns}:ug:{{{user}}}"

    def group_news(self, user: str) -> str:
        """Sorted set: the user's groups with read-diffused messages, each scored
        by a recent message's time (ms); ``~`` 0 once complete (``news_read.lua``)."""
        return f"{self.ns}:ugn:{{{user}}}"

    # -- feed ------------------------------------------------------------------
    def following(self, user: str) -> str:
        """Set of the ids ``user`` follows, plus ``~`` once complete."""
        return f"{self.ns}:fo:{{{user}}}"

    def pullers(self, author: str) -> str:
        """Hash (one of ``PULL_SHARDS``, by author): author -> newest post id not
        pushed to timelines; ``~`` once the shard is complete."""
        return f"{self.ns}:fp:{{fp:{self.pull_shard(author)}}}"

    def pullers_shard(self, shard: int) -> str:
        return f"{self.ns}:fp:{{fp:{shard}}}"

    def fanouts_pending(self, author: str) -> str:
        """Sorted set (sharded as ``pullers``): ``author|post`` -> post id, while
        the post's fan-out runs."""
        return self.fanouts_pending_shard(self.pull_shard(author))

    def fanouts_pending_shard(self, shard: int) -> str:
        return f"{self.ns}:fpend:{{fp:{shard}}}"

    @staticmethod
    def pull_shard(author: str) -> int:
        return zlib.crc32(author.encode()) % PULL_SHARDS

    def timeline_floors(self, user: str) -> str:
        """Hash (one of ``TIMELINE_SHARDS``, by user): user -> id below which the
        user's timeline was trimmed."""
        return f"{self.ns}:tlf:{{tl:{self.timeline_shard(user)}}}"

    def timeline_growth(self, user: str) -> str:
        """Hash (sharded as ``timeline_floors``): user -> entries added since its
        last trim."""
        return f"{self.ns}:tln:{{tl:{self.timeline_shard(user)}}}"

    def timeline_trims(self, shard: int) -> str:
        """Set, one per timeline shard: users whose timelines are due a trim."""
        return f"{self.ns}:tlt:{{tl:{shard}}}"

    @staticmethod
    def timeline_shard(user: str) -> int:
        return zlib.crc32(user.encode()) % TIMELINE_SHARDS

    def post_counts(self, post: int) -> str:
        """Hash: r (reposts), c (comments), l (likes), ok once merged with MongoDB.
        Tagged with the post's counter shard, so one script moves a counter and
        marks it dirty in one slot."""
        return f"{self.ns}:pc:{{pc:{post % COUNTER_SHARDS}}}:{post}"

    def like_mark(self, post: int, user: str, token: str, sign: str) -> str:
        """String: that one like's +1 (``sign`` ``+``) or -1 (``-``) is in the
        post's count (``like_once.lua``; the post's counter shard, its tag)."""
        return f"{self.ns}:plm:{{pc:{post % COUNTER_SHARDS}}}:{post}|{user}|{token}{sign}"

    def dirty_counts(self, shard: int) -> str:
        """Set, one per counter shard (post id mod ``COUNTER_SHARDS``): post ids
        whose counters changed since the last flush."""
        return f"{self.ns}:pcd:{{pc:{shard}}}"

    # -- per room (hash tag = room id) ----------------------------------------
    def reaction_counts(self, mid: int, shard: int) -> str:
        """Hash: emoji -> count of one shard of a message's reactions, ``~`` once
        built (``store/reactions_redis.py``; a tag per shard: they spread)."""
        return f"{self.ns}:rxc:{{rx:{mid}:{shard}}}"

    def reaction_users(self, mid: int, shard: int) -> str:
        """Set of "user|emoji" of the same shard (same slot as its counts)."""
        return f"{self.ns}:rxu:{{rx:{mid}:{shard}}}"

    def changes(self, user: str) -> str:
        """Zset: mid -> the position of its latest change (an edit, a reaction, a
        recall) among the user's 1:1 messages (``store/changes_redis.py``)."""
        return f"{self.ns}:chg:{{{user}}}"

    def group_changes(self, group: str) -> str:
        """Zset: mid -> the position of its latest change, of a group's messages."""
        return f"{self.ns}:gchg:{{g:{group}}}"

    def conv_settings(self, user: str) -> str:
        """Hash: conv -> the user's settings of it ("m", "p", "a" letters), ``~``
        once complete (``store/conv_settings.py``)."""
        return f"{self.ns}:cs:{{{user}}}"

    def room_online(self, room: str) -> str:
        """Hash: node name -> that node's local member count of ``room``."""
        return f"{self.ns}:ro:{{{room}}}"

    def room_mutes(self, room: str) -> str:
        """Hash: user -> unix time a mute in room R ends (the server API's)."""
        return f"{self.ns}:rmute:{{{room}}}"

    def room_meta(self, room: str) -> str:
        """Hash: ``e`` the room's epoch, ``p`` its last message position."""
        return f"{self.ns}:rm:{{{room}}}"

    def room_history(self, room: str) -> str:
        """List: the room's newest messages (positioned JSON), oldest first."""
        return f"{self.ns}:rh:{{{room}}}"

    def quota(self, user: str, what: str, window: int) -> str:
        """String: how many ``what`` ``user`` did in fixed window number
        ``window`` (expires with the window)."""
        return f"{self.ns}:q:{{{user}}}:{what}:{window}"

    def last_seen(self, user: str) -> str:
        """String: unix time the user's last device disconnected (30 days)."""
        return f"{self.ns}:seen:{{{user}}}"

    # -- nodes ---------------------------------------------------------------
    def node_lease(self, node_num: int) -> str:
        return f"{self.ns}:nodeid:{node_num}"

    def canary(self, tag: str, node: str) -> str:
        """String: a node's marker on one master of a Redis Cluster (``tag``
        picks the slot); its vanishing means that master lost its data."""
        return f"{self.ns}:cn:{{{tag}}}:{node}"

    def node_users(self, node: str) -> str:
        """Set: users whose presence a node still answers for (a device there, or
        a disconnect whose grace has not run out): survivors pop it when the
        node is dead."""
        return f"{self.ns}:pon:{node}"

    def nodes(self) -> str:
        """Sorted set: node name -> heartbeat expiry (unix seconds)."""
        return f"{self.ns}:nodes"

    def inflight(self) -> str:
        """Sorted set: node name -> the oldest mid its sends may still store, and
        node name + ``+live`` -> the oldest of its sends under way."""
        return f"{self.ns}:inflight"

    def dead_sends_claim(self, node: str) -> str:
        """String, short-lived: the live node putting a dead node's sends right
        (one at a time reads the store for them)."""
        return f"{self.ns}:dsc:{node}"
