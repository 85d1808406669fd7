"""The unread check over a recorded ``History`` (pure: the reads to make and the
counts to expect, then a ``/v1/conversations`` page compared with them).

After the run each user reads every conversation up to a message picked at
random; then ``/v1/conversations`` must give, per conversation:

- 1:1: the peer's messages after the read mid, a Redis loss or not (a user's
  unread is rebuilt from the MongoDB boxes and read marks once its Redis keys
  are gone: docs/reference/redis-keys.md); a send never acked may have been
  stored all the same (its ack lost, never resent): it may count.
- group: the group's seq (MongoDB's counter, the only source of seqs:
  docs/reference/groups.md; or the newest stored message's, when sends took
  seqs after it and were never stored) minus the member's read seq (docs/protocol.md,
  Groups); the read seq is the highest of the read mid's seq and the seqs of
  its own messages acked after the last Redis loss, or of all its own
  messages (their read seqs reach MongoDB a moment after Redis, best effort:
  docs/reference/groups.md "Redis keys"); join seq 0: every member was in
  from the start.

``total_unread`` must be the sum."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from redis.crc import key_slot

from testkit.clusters import LocalRedisCluster
from testkit.nemesis.history import History, Send, User

__all__ = ["UnreadPlan", "plan_unread", "redis_outages", "unread_mismatches",
           "unread_report"]


@dataclass
class UnreadPlan:
    """One user's reads (conversation -> the mid it reads up to) and the unread
    count each conversation must then show, as a range (lo, hi)."""

    user: User
    reads: dict[str, int] = field(default_factory=dict)
    expect: dict[str, tuple[int, int]] = field(default_factory=dict)
    ambiguous: int = 0  # 1:1 messages acked while Redis was down


def redis_outages(h: History, user: str | None = None) -> list[tuple[float, float]]:
    """(kill, restart) of every Redis fault applied that lost ``user``'s keys:
    the whole Redis, or the Redis Cluster master holding the user's slot (every
    key of a user is tagged ``{user}``). ``user`` None: every Redis fault."""
    slot = key_slot(f"{{{user}}}".encode()) if user is not None else None
    return [(f.t_start, f.t_heal) for f in h.faults
            if f.t_start is not None and f.t_heal is not None
            and (f.kind == "redis" or (f.kind == "redis_master"
                                       and (slot is None or LocalRedisCluster.owns(f.node, slot))))]


def plan_unread(h: History, rng: random.Random, counters: dict[str, tuple[int, int]]
                ) -> list[UnreadPlan]:
    """Each user's plan, in user order (``rng`` picks the read marks;
    ``counters``: each group's newest stored seq and seq counter in the store)."""
    plans = []
    for r in h.everyone:
        outages = redis_outages(h, r.name)
        last_restart = max((heal for _, heal in outages), default=float("-inf"))
        plan = UnreadPlan(r)
        _plan_dms(h, plan, rng, outages)
        for g in r.groups:
            _plan_group(h, plan, g, rng, counters, last_restart)
        plans.append(plan)
    return plans


def _incoming_dms(h: History, r: User) -> dict[str, list[Send]]:
    """The acked 1:1 messages to ``r``, per sender, in mid order."""
    incoming: dict[str, list[Send]] = defaultdict(list)
    for u in h.everyone:
        for s in u.sends.values():
            if s.mid is not None and s.kind == "dm" and s.to == r.name:
                incoming[u.name].append(s)
    for got in incoming.values():
        got.sort(key=lambda s: s.mid or 0)
    return incoming


def _unacked_dms(h: History, r: User) -> dict[str, int]:
    """Per sender, its 1:1 sends to ``r`` never acked (any may be stored)."""
    out: dict[str, int] = defaultdict(int)
    for u in h.everyone:
        for s in u.sends.values():
            if s.mid is None and s.kind == "dm" and s.to == r.name:
                out[u.name] += 1
    return out


def _plan_dms(h: History, plan: UnreadPlan, rng: random.Random,
              outages: list[tuple[float, float]]) -> None:
    r = plan.user
    unacked = _unacked_dms(h, r)
    for peer, got in _incoming_dms(h, r).items():
        read_mid = got[rng.randrange(len(got))].mid if got else None
        if read_mid is not None:
            plan.reads[peer] = read_mid
        n = sum(1 for s in got if read_mid is None or (s.mid or 0) > read_mid)
        maybe = unacked.get(peer, 0)
        plan.ambiguous += maybe
        plan.expect[peer] = (n, n + maybe)
    if r.peer and r.peer not in plan.expect:
        plan.expect[r.peer] = (0, 0)  # its own sends: never unread


def _plan_group(h: History, plan: UnreadPlan, g: str, rng: random.Random,
                counters: dict[str, tuple[int, int]], last_restart: float) -> None:
    mine = plan.user.name + "-"
    group_sends = [s for u in h.everyone for s in u.sends.values()
                   if s.kind == "group" and s.to == g and s.mid is not None]
    others = sorted((s for s in group_sends if not s.cmid.startswith(mine)),
                    key=lambda s: s.mid or 0)
    read_seq = 0
    if others:
        pick = others[rng.randrange(len(others))]
        plan.reads[f"g:{g}"] = pick.mid or 0
        read_seq = pick.seq or 0
    own = [(s.seq or 0, s.t_ack) for s in group_sends
           if s.cmid.startswith(mine) and s.t_ack is not None]
    # Its own messages are read: in Redis at once, in MongoDB a moment later
    # (best effort). Those acked after the last loss of its keys surely count
    # as read; those before, only if MongoDB's copy was written in time.
    surely = max([read_seq, *(seq for seq, t in own if t > last_restart)])
    maybe = max([read_seq, *(seq for seq, _ in own)])
    # Seqs taken after the newest stored message (sends never stored: a
    # tombstone, or a node killed in between) may count or not.
    newest, counter = counters.get(g, (0, 0))
    plan.expect[f"g:{g}"] = (max(0, newest - maybe), max(0, counter - surely))


def unread_mismatches(plan: UnreadPlan, page: dict[str, Any]) -> list[dict[str, Any]]:
    """Where ``/v1/conversations`` (``page``) differs from the plan: a count out
    of its range, an unexpected conversation with unread, a wrong total."""
    name = plan.user.name
    have = {c["conv"]: int(c.get("unread") or 0) for c in page["conversations"]}
    wrong: list[dict[str, Any]] = []
    total = 0
    for conv, (lo, hi) in plan.expect.items():
        got_n = have.get(conv, 0)
        total += got_n
        if not lo <= got_n <= hi:
            wrong.append({"user": name, "conv": conv, "unread": got_n,
                          "expected": lo if lo == hi else [lo, hi],
                          "read_mid": plan.reads.get(conv)})
    for conv, n in have.items():
        if conv not in plan.expect and n:
            wrong.append({"user": name, "conv": conv, "unread": n, "expected": 0})
            total += n
    if int(page.get("total_unread") or 0) != total:
        wrong.append({"user": name, "total_unread": page.get("total_unread"),
                      "sum_of_convs": total})
    return wrong


def unread_report(checked: list[tuple[UnreadPlan, dict[str, Any]]]) -> dict[str, Any]:
    """The report keys, from each plan and the page read after its reads."""
    wrong = [w for plan, page in checked for w in unread_mismatches(plan, page)]
    return {"unread_wrong": len(wrong),
            "unread_checked": sum(len(plan.expect) for plan, _ in checked),
            "unread_ambiguous": sum(plan.ambiguous for plan, _ in checked),
            "details_unread": wrong[:20]}
