"""The room check over a recorded ``History``: silent gaps in each member's room
stream (pure: no servers), and the members behind the room's end.

A member's room stream (SDK events: the first ``joined``, ``RoomMessages``
live and at a rejoin, ``RoomRejoined``, ``room_gap``): a jump in ``pos``
within an epoch, or a new epoch not starting at 1, with no ``room_gap`` or
``recovered: false`` before it is a silent gap; so is a rejoin that says
``recovered: true`` and skips positions, and a member who, at the end, is
behind the room's last position (a missed tail)."""

from __future__ import annotations

from typing import Any

from testkit.nemesis.checks import fault_at
from testkit.nemesis.history import History, User

__all__ = ["RoomStream", "room_report", "silent_room_gaps", "tail_gaps"]


class RoomStream:
    """One member's room stream replayed: where it is (``epoch``, ``pos``),
    whether it was told of a gap since its last position, and each silent gap
    appended to ``silent``."""

    def __init__(self, h: History, u: User, silent: list[dict[str, Any]]) -> None:
        self.h, self.u, self.silent = h, u, silent
        self.epoch: str | None = None
        self.pos = 0
        self.told = False
        self.told_n = 0  # room_gap frames and unrecovered rejoins
        self.msgs = 0  # positions taken (each new one once)

    def replay(self) -> dict[str, int]:
        for t, kind, data in self.u.room_log:
            if kind == "joined":
                self._joined(t, data)
            elif kind == "gap":
                self._told()
                self._new_epoch(data.get("epoch"))
            elif kind == "rejoined":
                self._rejoined(t, *data)
            elif kind.startswith("msgs:"):
                epoch, positions = data
                self._new_epoch(epoch)
                for p in positions:
                    if isinstance(p, int):
                        self._take(p, t, kind)
        return {"told": self.told_n, "msgs": self.msgs}

    def _told(self) -> None:
        self.told, self.told_n = True, self.told_n + 1

    def _new_epoch(self, e: Any) -> None:
        if isinstance(e, str) and e != self.epoch:
            self.epoch, self.pos = e, 0

    def _gap(self, t: float, how: str, **where: Any) -> None:
        self.silent.append({"user": self.u.name, "epoch": self.epoch, "after": self.pos,
                            **where, "t": self.h.rel(t), "how": how,
                            "fault": fault_at(self.h, t, t)})

    def _take(self, p: int, t: float, how: str) -> None:
        if p <= self.pos:
            return
        self.msgs += 1
        if p > self.pos + 1 and not self.told:
            self._gap(t, how, got=p)
        self.told = False
        self.pos = p

    def _joined(self, t: float, data: tuple[dict[str, Any], list[Any]]) -> None:
        reply, positions = data
        self._new_epoch(reply.get("epoch"))
        self.pos = max(self.pos, int(reply.get("pos") or 0))
        for p in positions:
            self._take(int(p), t, "join")

    def _rejoined(self, t: float, recovered: bool, reply: dict[str, Any]) -> None:
        if not recovered:
            self._told()
        e = reply.get("epoch")
        if e is None:
            self.epoch, self.pos = None, 0
        self._new_epoch(e)
        for m in reply.get("msgs") or ():
            if isinstance(m.get("pos"), int):
                self._take(m["pos"], t, "rejoin")
        rp = reply.get("pos")
        if isinstance(rp, int) and rp > self.pos:
            if not self.told:
                self._gap(t, "rejoin said recovered", room_pos=rp)
            self.pos = rp
        self.told = False


def silent_room_gaps(h: History) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """Every member's silent gaps (in member order), and per member how often it
    was told of a gap and how many positions it took."""
    silent: list[dict[str, Any]] = []
    streams = {u.name: RoomStream(h, u, silent).replay() for u in h.everyone}
    return silent, streams


def tail_gaps(behind: list[dict[str, Any]], final: dict[str, Any]) -> list[dict[str, Any]]:
    """The members still behind the room's last position at the end (``behind``:
    user, epoch, pos) as silent gaps."""
    return [{"user": b["user"], "tail": True, "room_epoch": final["epoch"],
             "room_pos": final["pos"], "member_epoch": b["epoch"], "member_pos": b["pos"]}
            for b in behind]


def room_report(h: History, silent: list[dict[str, Any]],
                streams: dict[str, dict[str, int]], final: dict[str, Any]) -> dict[str, Any]:
    return {"silent_gaps": len(silent),
            "room_app_rejoins": sum(u.room_rejoins for u in h.everyone),
            "room_told": sum(s["told"] for s in streams.values()),
            "room_msgs_seen": sum(s["msgs"] for s in streams.values()),
            "room_final": final, "details_silent_gaps": silent[:30]}
