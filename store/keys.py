"""Every Redis key the product uses, built here and nowhere else.

Keys of one user carry that user's id as the Redis Cluster hash tag
(``{alice}``), so a Lua script that touches one user's keys touches one slot.
Ids are validated against ``[A-Za-z0-9_.:-]{1,64}`` before they get here, so
they never contain braces.
"""

from __future__ import annotations

__all__ = ["Keys"]


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

    def unread(self, user: str) -> str:
        """Hash: conversation -> unread count; field ``*`` = total."""
        return f"{self.ns}:unr:{{{user}}}"

    def unread_mids(self, user: str, conv: str) -> str:
        """Sorted set of unread mids in one conversation (score = member = mid)."""
        return f"{self.ns}:unm:{{{user}}}:{conv}"

    def convs(self, user: str) -> str:
        """Sorted set: conversation -> mid of its last message."""
        return f"{self.ns}:cv:{{{user}}}"

    def conv_last(self, user: str) -> str:
        """Hash: conversation -> encoded last message."""
        return f"{self.ns}:cvl:{{{user}}}"

    def dedup(self, user: str, cmid: str) -> str:
        """String: ``p:<mid>`` while a send is in flight, ``d:<mid>`` once acked."""
        return f"{self.ns}:dd:{{{user}}}:{cmid}"

    def routes(self, user: str) -> str:
        """Hash: connection id -> node id, for every connected device."""
        return f"{self.ns}:rt:{{{user}}}"

    # -- groups (hash tag = "g:" + group id; per user: the user id) ------------
    def group_state(self, group: str) -> str:
        """Hash: seq, lastmid, last (encoded newest message), rdmid, ok."""
        return f"{self.ns}:gs:{{g:{group}}}"

    def group_members(self, group: str) -> str:
        """Set of member ids, plus the marker ``~`` once complete."""
        return f"{self.ns}:gm:{{g:{group}}}"

    def user_groups(self, user: str) -> str:
        """Hash: group -> from_seq, ``r:<group>`` -> read seq, ``~`` once complete."""
        return f"{self.ns}:ug:{{{user}}}"

    # -- feed ------------------------------------------------------------------
    def following(self, user: str) -> str:
        """Set of the ids ``user`` follows, plus ``~`` once complete."""
        return f"{self.ns}:fo:{{{user}}}"

    def pullers(self) -> str:
        """Hash: author -> newest post id not pushed to timelines; ``~`` once complete."""
        return f"{self.ns}:fp"

    def fanouts_pending(self) -> str:
        """Sorted set: ``author|post`` -> post id, while the post's fan-out runs."""
        return f"{self.ns}:fpend"

    def timeline_floors(self) -> str:
        """Hash: user -> id below which the user's timeline was trimmed."""
        return f"{self.ns}:tlf"

    def timeline_growth(self) -> str:
        """Hash: user -> timeline entries added since its last trim."""
        return f"{self.ns}:tln"

    def timeline_trims(self) -> str:
        """Set of users whose timelines are due a trim."""
        return f"{self.ns}:tlt"

    def post_counts(self, post: int) -> str:
        """Hash: r (reposts), c (comments), l (likes), ok once merged with MongoDB."""
        return f"{self.ns}:pc:{{p:{post}}}"

    def dirty_counts(self) -> str:
        """Set of post ids whose counters changed since the last flush."""
        return f"{self.ns}:pcd"

    # -- per room (hash tag = room id) ----------------------------------------
    def room_online(self, room: str) -> str:
        """Hash: node name -> that node's local member count of ``room``."""
        return f"{self.ns}:ro:{{{room}}}"

    # -- nodes ---------------------------------------------------------------
    def node_lease(self, node_num: int) -> str:
        return f"{self.ns}:nodeid:{node_num}"

    def nodes(self) -> str:
        """Sorted set: node name -> heartbeat expiry (unix seconds)."""
        return f"{self.ns}:nodes"
