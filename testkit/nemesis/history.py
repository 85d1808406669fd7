"""What a nemesis run records, the input of every check: per user (``User``) its
sends and their acks (``Send``), the raw ack frames, the pushes per connection,
the SDK's deliveries, its connections (``Conn``) and its room stream; and the
``History`` that holds them with the faults as applied.

Every time is on one clock (``now``: ``time.perf_counter``); ``History.rel``
gives it in seconds after the traffic started, as the report shows it."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from imgate_client import Client

from testkit.nemesis.schedule import Fault

__all__ = ["Conn", "History", "Send", "User", "now"]


def now() -> float:
    """The run's clock."""
    return time.perf_counter()


@dataclass
class Send:
    """One 1:1 or group message a user sent (resent by the SDK under one cmid)."""

    cmid: str
    kind: str  # "dm" or "group"
    to: str  # peer, or group id
    k: int  # the sender's k-th send to ``to``
    t_first: float
    t_ack: float | None = None
    mid: int | None = None
    seq: int | None = None
    node: int | None = None  # the node of the connection when acked
    error: str | None = None


@dataclass
class Conn:
    """One connection of a client (its generation ``gen``): which node, open when."""

    gen: int
    node: int
    t_open: float  # Connected (after its sync)
    t_close: float | None = None
    close_code: int | None = None


@dataclass(eq=False)
class User:
    """A user (or a node's probe, ``probe_of`` >= 0) and what its client recorded.

    ``room_log`` holds the room stream as ``(t, kind, data)``: ``"joined"``
    ``(reply, positions)``, ``"gap"`` (the ``room_gap`` frame), ``"rejoined"``
    ``(recovered, reply)``, ``"msgs:<via>"`` ``(epoch, positions)``."""

    name: str
    index: int
    probe_of: int = -1  # >= 0: pinned to that node
    peer: str = ""  # 1:1 target
    groups: list[str] = field(default_factory=list)
    client: Client = field(init=False, repr=False)
    sends: dict[str, Send] = field(default_factory=dict)
    raw_acks: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    pushes: dict[int, dict[int, float]] = field(default_factory=lambda: defaultdict(dict))
    delivered: dict[int, list[tuple[str, float, int]]] = field(
        default_factory=lambda: defaultdict(list))  # mid -> (via, t, gen) per SDK Message
    frames: dict[int, dict[str, Any]] = field(default_factory=dict)  # mid -> a frame of it
    conns: dict[int, Conn] = field(default_factory=dict)
    room_log: list[tuple[float, str, Any]] = field(default_factory=list)
    room_ok: list[tuple[float, int]] = field(default_factory=list)
    room_errors: Counter[str] = field(default_factory=Counter)
    room_rejoins: int = 0  # joins by the app after the SDK dropped the room
    synced: list[dict[str, Any]] = field(default_factory=list)  # final /v1/sync from 0
    synced_mids: set[int] = field(default_factory=set)
    connect_failures: int = 0


@dataclass
class History:
    """Everything the checks read: the users and probes with what they recorded,
    the groups' members, the faults (with their start and heal times), the start
    of the traffic ``t0`` and the clock (``now``, for a fault not healed yet)."""

    users: list[User]
    probes: list[User]
    group_members: dict[str, list[str]]
    faults: list[Fault]
    t0: float = 0.0
    clock: Callable[[], float] = now

    @property
    def everyone(self) -> list[User]:
        return self.users + self.probes

    def by_name(self) -> dict[str, User]:
        return {u.name: u for u in self.everyone}

    def rel(self, t: float | None) -> float | None:
        """``t`` in seconds after ``t0`` (ms precision), as reported."""
        return None if t is None else round(t - self.t0, 3)

    def healed_faults(self) -> list[Fault]:
        """The faults applied and healed, in schedule order."""
        return [f for f in self.faults if f.t_start is not None and f.t_heal is not None]
