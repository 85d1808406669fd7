"""The checks of the delivery guarantees of docs/protocol.md over a recorded
``History``: pure functions (no servers), each one rule. The room stream and the
unread counts have modules of their own (``room_checks``, ``unread_checks``).

- ``check_messages``: ``lost``, ``duplicated``, ``reordered``, ``double_acked``;
- ``check_stored``: ``stored_duplicated`` (two mids for one cmid or one group
  seq in the store itself);
- ``check_group_history``: ``history_missing``, ``history_duplicated`` (given
  what each member's ``/v1/history`` held);
- ``check_deaf``: ``deaf_pushes`` (a device connected all along, not pushed to);
- ``fault_report``: per fault its evidence, the acks during and after it and its
  heal time; ``connects_during_faults``, ``duplicate_pushes``.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from typing import Any

from testkit.nemesis.history import History, Send, User

__all__ = ["PUSH_GRACE_S", "check_deaf", "check_group_history", "check_messages", "check_stored",
           "connects_during_faults", "describe", "duplicate_pushes", "fault_at",
           "fault_report", "missing", "receivers"]

PUSH_GRACE_S = 3.0  # a push is owed this long after its ack (or after the heal of a fault)


# -- who should have got what -------------------------------------------------------------
def receivers(h: History, sender: User, s: Send) -> list[User]:
    """The peer of a 1:1 message; the other members of a group message's group."""
    by = h.by_name()
    if s.kind == "dm":
        return [by[s.to]]
    return [by[m] for m in h.group_members[s.to] if m != sender.name]


def missing(h: History, s: Send, sender: User) -> list[User]:
    """The receivers of ``s`` that got it neither from the SDK nor the final sync."""
    return [r for r in receivers(h, sender, s)
            if s.mid not in r.delivered and s.mid not in r.synced_mids]


def fault_at(h: History, t1: float | None, t2: float | None) -> list[str]:
    """The faults (``kind@start`` and ``/nN``) within ``PUSH_GRACE_S`` of [t1, t2]."""
    out = []
    for f in h.faults:
        if f.t_start is None or t1 is None:
            continue
        heal = f.t_heal or h.clock()
        if f.t_start <= (t2 or t1) + PUSH_GRACE_S and heal + PUSH_GRACE_S >= t1:
            out.append(f"{f.kind}@{h.rel(f.t_start)}" + (f"/n{f.node}" if f.node >= 0 else ""))
    return out


def describe(h: History, s: Send, sender: User, r: User) -> dict[str, Any]:
    """A message of the evidence: who to whom, its ids, its times, the faults near it."""
    return {"from": sender.name, "to": r.name, "kind": s.kind, "target": s.to,
            "cmid": s.cmid, "mid": s.mid, "seq": s.seq, "t_first": h.rel(s.t_first),
            "t_ack": h.rel(s.t_ack), "fault": fault_at(h, s.t_first, s.t_ack)}


def _acked(u: User) -> list[Send]:
    return [s for s in u.sends.values() if s.mid is not None]


# -- lost, duplicated, reordered, double acked ----------------------------------------------
def check_messages(h: History) -> dict[str, Any]:
    """Every acked 1:1 and group message delivered to each receiver (SDK
    ``Message`` by push or sync, or the final ``/v1/sync``): ``lost`` otherwise.
    ``duplicated``: a receiver given one mid twice by the SDK, or holding two
    mids for one cmid (the body carries it), or one group seq under two mids.
    ``reordered``: a sender's sends to one target are sequential, so their mids
    (and seqs) must rise in send order. ``double_acked``: one cmid acked with
    two mids (every raw ``ack`` frame counted)."""
    lost, dups = lost_messages(h), duplicates(h)
    reordered, double = reorders(h), double_acks(h)
    return {"lost": len(lost), "duplicated": len(dups), "reordered": len(reordered),
            "double_acked": len(double),
            "details": {"lost": lost[:20], "duplicated": dups[:20],
                        "reordered": reordered[:20], "double_acked": double[:20]}}


def double_acks(h: History) -> list[dict[str, Any]]:
    return [{"user": u.name, "cmid": cmid, "mids": sorted(mids)}
            for u in h.everyone for cmid, mids in u.raw_acks.items() if len(mids) > 1]


def lost_messages(h: History) -> list[dict[str, Any]]:
    return [describe(h, s, u, r) for u in h.everyone for s in _acked(u)
            for r in missing(h, s, u)]


def reorders(h: History) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for u in h.everyone:
        by_target: dict[str, list[Send]] = defaultdict(list)
        for s in _acked(u):
            by_target[s.to].append(s)
        for to, sends in by_target.items():
            sends.sort(key=lambda s: s.k)
            for a, b in itertools.pairwise(sends):
                assert a.mid is not None and b.mid is not None
                if b.mid <= a.mid or (a.seq is not None and b.seq is not None
                                      and b.seq <= a.seq):
                    out.append({"from": u.name, "to": to, "first": a.cmid, "then": b.cmid,
                                "mids": [a.mid, b.mid], "seqs": [a.seq, b.seq]})
    return out


def duplicates(h: History) -> list[dict[str, Any]]:
    return [d for r in h.everyone for d in _duplicates_of(r)]


def _duplicates_of(r: User) -> list[dict[str, Any]]:
    out = [{"user": r.name, "mid": mid, "deliveries": len(ds)}
           for mid, ds in r.delivered.items() if len(ds) > 1]
    seen: dict[tuple[str, str], set[int]] = defaultdict(set)
    seqs: dict[tuple[str, int], set[int]] = defaultdict(set)
    for m in [*r.synced, *(r.frames[mid] for mid in r.delivered if mid in r.frames)]:
        body = m.get("body")
        if isinstance(body, dict) and isinstance(body.get("c"), str):
            seen[(str(m.get("from")), body["c"])].add(int(m["mid"]))
        if m.get("op") == "group_msg" and isinstance(m.get("seq"), int):
            seqs[(str(m.get("group")), m["seq"])].add(int(m["mid"]))
    out += [{"user": r.name, "from": frm, "cmid": cmid, "mids": sorted(mids)}
            for (frm, cmid), mids in seen.items() if len(mids) > 1]
    out += [{"user": r.name, "group": g, "seq": seq, "mids": sorted(mids)}
            for (g, seq), mids in seqs.items() if len(mids) > 1]
    return out


def check_stored(copies: dict[str, Any]) -> dict[str, Any]:
    """What the store holds (``readback.stored_copies``): one mid per (sender,
    cmid) and per (group, seq), whoever synced it."""
    dups = [{"from": frm, "cmid": cmid, "mids": sorted(mids)}
            for (frm, cmid), mids in copies["by_cmid"].items() if len(mids) > 1]
    dups += [{"group": g, "seq": seq, "mids": sorted(mids)}
             for (g, seq), mids in copies["by_seq"].items() if len(mids) > 1]
    return {"stored_duplicated": len(dups), "stored_messages": len(copies["by_cmid"]),
            "details_stored_duplicated": dups[:20]}


# -- group history ------------------------------------------------------------------------
def check_group_history(h: History, held: dict[tuple[str, str], Counter[int]]
                        ) -> dict[str, Any]:
    """Each member's ``/v1/history/g:G`` (``held[(G, member)]``: how often each
    seq came back) holds every acked seq of the group once."""
    acked = {(s.to, s.seq): (u.name, s) for u in h.everyone for s in u.sends.values()
             if s.kind == "group" and s.mid is not None}
    by = h.by_name()
    gaps: list[dict[str, Any]] = []
    dup = 0
    for g, members in h.group_members.items():
        for name in members:
            have = held.get((g, name), Counter())
            dup += sum(1 for c in have.values() if c > 1)
            for (gg, seq), (frm, s) in acked.items():
                if gg == g and frm != name and seq not in have:
                    gaps.append({"member": name, **describe(h, s, by[frm], by[name])})
    return {"history_missing": len(gaps), "history_duplicated": dup,
            "details_history": gaps[:20]}


# -- deaf pushes --------------------------------------------------------------------------
def push_due(h: History, s: Send) -> float:
    """When the push of ``s`` is owed by: ``PUSH_GRACE_S`` after its ack, or after
    the heal of a fault that overlapped it."""
    assert s.t_ack is not None
    due = s.t_ack + PUSH_GRACE_S
    for f in h.faults:
        if (f.t_start is not None and f.t_heal is not None
                and f.t_start <= due and f.t_heal >= s.t_first):
            due = max(due, f.t_heal + PUSH_GRACE_S)
    return due


KILL_WINDOW_S = 0.05  # an ack this close to a kill -9 of its node: see check_deaf


def killed_at_ack(h: History, s: Send) -> bool:
    """The node that acked ``s`` was killed (SIGKILL) within ``KILL_WINDOW_S`` of
    the ack reaching the client."""
    assert s.t_ack is not None
    return any(f.kind == "kill9" and f.node == s.node and f.t_start is not None
               and abs(f.t_start - s.t_ack) <= KILL_WINDOW_S for f in h.faults)


def check_deaf(h: History) -> dict[str, Any]:
    """A receiver's connection open (``Connected``: set up and synced) before a
    message's first send and still open when its push is owed (``push_due``: a
    broker outage is made good by the replay once the link is back) must have
    got it by push. Left out, and counted in ``pushes_lost_with_node``: a
    message whose node was killed with SIGKILL in the instant after it wrote the
    ack and before it handed the pushes to the broker (docs/protocol.md, the
    window it names: the receivers have the message by sync)."""
    deaf: list[dict[str, Any]] = []
    owed = lost_with_node = 0
    for u in h.everyone:
        for s in u.sends.values():
            if s.mid is None or s.t_ack is None:
                continue
            if killed_at_ack(h, s):
                lost_with_node += sum(1 for r in receivers(h, u, s)
                                      if not any(s.mid in got for got in r.pushes.values()))
                continue
            due = push_due(h, s)
            for r in receivers(h, u, s):
                for c in r.conns.values():
                    closed = c.t_close if c.t_close is not None else float("inf")
                    if not (c.t_open < s.t_first and closed > due):
                        continue
                    owed += 1
                    if s.mid not in r.pushes.get(c.gen, {}):
                        deaf.append({**describe(h, s, u, r), "gen": c.gen, "node": c.node,
                                     "conn_open": h.rel(c.t_open)})
    return {"deaf_pushes": len(deaf), "pushes_owed": owed,
            "pushes_lost_with_node": lost_with_node, "details_deaf": deaf[:20]}


def duplicate_pushes(h: History) -> int:
    """Pushes of one mid to one user on more than one connection (not an error:
    a resend after a reconnect)."""
    return sum(max(0, sum(1 for gen in u.pushes.values() if mid in gen) - 1)
               for u in h.everyone for mid in {m for g in u.pushes.values() for m in g})


# -- the faults ---------------------------------------------------------------------------
def connects_during_faults(h: History) -> dict[str, int]:
    """Connections set up (``Connected``) while each fault was on."""
    out: Counter[str] = Counter()
    for f in h.healed_faults():
        assert f.t_start is not None and f.t_heal is not None
        out[f"{f.kind}@{h.rel(f.t_start)}"] += sum(
            1 for u in h.everyone for c in u.conns.values()
            if f.t_start <= c.t_open <= f.t_heal)
    return dict(out)


def _acks(h: History) -> list[tuple[float, int | None, User]]:
    """Every ack: (time, node, sender), in time order."""
    return sorted(((s.t_ack, s.node, u) for u in h.everyone for s in u.sends.values()
                   if s.t_ack is not None), key=lambda a: a[0])


def _room_oks(h: History) -> list[tuple[float, int, User]]:
    return sorted(((t, n, u) for u in h.everyone for t, n in u.room_ok), key=lambda a: a[:2])


def fault_report(h: History) -> list[dict[str, Any]]:
    """Per fault applied, in time order: its evidence, the acks (and room sends)
    during it and between its heal and the next fault, and its heal time."""
    acks, rooms = _acks(h), _room_oks(h)
    faults = sorted((f for f in h.faults if f.t_start is not None),
                    key=lambda f: f.t_start or 0)
    out = []
    for i, f in enumerate(faults):
        assert f.t_start is not None and f.t_heal is not None
        start, heal = f.t_start, f.t_heal
        nxt = faults[i + 1].t_start if i + 1 < len(faults) else h.clock()
        end = nxt or heal
        path, first = _first_after_heal(h, f.kind, f.node, heal, acks, rooms)
        out.append({"kind": f.kind, "node": f.node, "at_s": h.rel(start),
                    "healed_at_s": h.rel(heal), "skipped": f.skipped, "evidence": f.evidence,
                    "acks_during": sum(1 for t, _, _ in acks if start <= t <= heal),
                    "room_ok_during": sum(1 for t, _, _ in rooms if start <= t <= heal),
                    "acks_after": sum(1 for t, _, _ in acks if heal < t <= end),
                    "room_ok_after": sum(1 for t, _, _ in rooms if heal < t <= end),
                    "heal_path": path,
                    "heal_s": None if first is None else round(first - heal, 3)})
    return out


def _first_after_heal(h: History, kind: str, node: int, heal: float,
                      acks: list[tuple[float, int | None, User]],
                      rooms: list[tuple[float, int, User]]) -> tuple[str, float | None]:
    """How a fault's heal is timed, and the time of the first success on that path."""
    if kind in ("kill9", "drain"):
        probe = h.probes[node]
        return ("the node's probe (pinned to it): first 1:1 ack",
                min((t for t, _, u in acks if u is probe and t > heal), default=None))
    if kind == "broker_cut":
        return ("first room_send ok on the cut node (needs its broker link)",
                min((t for t, n, _ in rooms if n == node and t > heal), default=None))
    return ("first 1:1 or group ack, any node",
            min((t for t, _, _ in acks if t > heal), default=None))
