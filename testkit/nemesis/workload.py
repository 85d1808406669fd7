"""The traffic of a nemesis run, and what each client saw.

``users`` SDK clients (``imgate_client.Client``: reconnects, round robin over
the nodes up, resends with the same cmid until acked, syncs on connect, rejoins
rooms with ``since``), each sending 1:1 messages to the next user (a ring),
group messages to the groups it is in (created over HTTP first) and room
messages to one room all of them joined; plus one probe client per node, pinned
to that node (the heal time of a fault of that node is the first ack it gets
after the heal); and now and then a random user's socket dropped (churn).
Every frame each client gets is recorded in its ``User``."""

from __future__ import annotations

import asyncio
import functools
import itertools
import random
from collections import Counter
from typing import Any

from imgate_client import (
    Client,
    ClientStopped,
    Connected,
    ConnectionLost,
    Disconnected,
    Event,
    Message,
    Push,
    RoomGap,
    RoomMessages,
    RoomRejoined,
    SendTimeout,
    ServerError,
)
from imgate_client.core.policy import Backoff, ReconnectPolicy

from testkit.nemesis.cluster import Cluster
from testkit.nemesis.config import SECRET, SYNC_LIMIT, NemesisConfig
from testkit.nemesis.history import Conn, Send, User, now
from testkit.poll import bounded
from testkit.tokens import issue_token

__all__ = ["ROOM", "Workload"]

ROOM = "nemroom"


class Workload:
    """The users, probes and groups; their clients' connections and recordings;
    the pumps that send (``start_traffic`` / ``stop_traffic``)."""

    def __init__(self, cfg: NemesisConfig, cluster: Cluster, rng: random.Random) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.rng = rng
        self.room = ROOM
        self.users: list[User] = []
        self.probes: list[User] = []
        self.group_members: dict[str, list[str]] = {}
        self.stopping = False
        self.churned: list[tuple[float, str]] = []
        self._rr = itertools.count()
        self._tasks: list[asyncio.Task[Any]] = []

    @property
    def everyone(self) -> list[User]:
        return self.users + self.probes

    # -- the clients ----------------------------------------------------------------------
    def make_users(self) -> None:
        n = self.cfg.users
        self.users = [User(f"u{i:02d}", i) for i in range(n)]
        for i, u in enumerate(self.users):
            u.peer = self.users[(i + 1) % n].name
        self.probes = [User(f"p{i}", n + i, probe_of=i, peer=self.users[i % n].name)
                       for i in range(self.cfg.nodes)]
        for u in self.everyone:
            u.client = self._make_client(u, self._node_order(u))
            self._tap(u)

    def _node_order(self, u: User) -> list[int]:
        """The nodes ``u`` tries, in order: a probe only its own; a user all, from
        its home node on."""
        if u.probe_of >= 0:
            return [u.probe_of]
        slots = self.cluster.slots
        home = u.index % len(slots)
        return [(home + k) % len(slots) for k in range(len(slots))]

    def _make_client(self, u: User, order: list[int]) -> Client:
        slots = self.cluster.slots
        rng = random.Random(self.cfg.seed * 1000 + u.index)
        return Client(
            [slots[i].ws_url for i in order],
            http_urls=[slots[i].http_url for i in order],
            token=issue_token(SECRET, u.name, 7200),
            on_event=functools.partial(self._on_event, u, order), sync_limit=SYNC_LIMIT,
            ack_timeout=5.0, send_timeout=self.cfg.send_timeout, refresh_ahead=None,
            http_timeout=10.0, rng=rng,
            policy=ReconnectPolicy(Backoff(base=0.2, cap=2.0, rng=rng), rng=rng),
            next_url=None if u.probe_of >= 0 else functools.partial(self._next_url, order))

    def _next_url(self, order: list[int], index: int) -> int:
        """Round robin over the nodes up (any node when none is)."""
        alive = [s.index for s in self.cluster.slots if s.up]
        if not alive:
            return index + 1
        return order.index(alive[next(self._rr) % len(alive)])

    def _tap(self, u: User) -> None:
        """Every frame the client gets, recorded before the client sees it."""
        client = u.client
        original = client._on_frame

        def tap(f: dict[str, Any]) -> None:
            op = f.get("op")
            if op == "ack" and isinstance(f.get("cmid"), str):
                u.raw_acks[f["cmid"]].add(int(f["mid"]))
            elif op in ("msg", "group_msg") and f.get("re") is None and "mid" in f:
                u.pushes[client._gen].setdefault(int(f["mid"]), now())
                u.frames.setdefault(int(f["mid"]), f)
            original(f)

        client._on_frame = tap  # type: ignore[method-assign]

    def _node_of(self, order: list[int], url: str, u: User) -> int:
        return order[u.client.urls.index(url)]

    def _on_event(self, u: User, order: list[int], ev: Event) -> None:
        t = now()
        gen = u.client._gen
        if isinstance(ev, Message):
            u.delivered[ev.mid].append((ev.via, t, gen))
            u.frames.setdefault(ev.mid, ev.frame)
        elif isinstance(ev, Connected):
            u.conns[gen] = Conn(gen, self._node_of(order, ev.url, u), t)
        elif isinstance(ev, ConnectionLost):
            self._on_lost(u, order, ev, t, gen)
        elif isinstance(ev, RoomMessages):
            u.room_log.append((t, f"msgs:{ev.via}", (ev.epoch, [m.get("pos") for m in ev.msgs])))
        elif isinstance(ev, RoomRejoined):
            u.room_log.append((t, "rejoined", (ev.recovered, ev.reply)))
        elif isinstance(ev, Push) and ev.op == "room_gap":
            u.room_log.append((t, "gap", dict(ev.frame)))
        elif isinstance(ev, RoomGap):  # the SDK tells its app of positions it will not show
            u.room_log.append((t, "gap", {"epoch": ev.epoch, "after": ev.after,
                                          "reason": ev.reason}))

    def _on_lost(self, u: User, order: list[int], ev: ConnectionLost, t: float,
                 gen: int) -> None:
        if not ev.opened:
            u.connect_failures += 1
            return
        c = u.conns.get(gen)
        if c is not None and c.t_close is None:
            c.t_close, c.close_code = t, ev.code
        elif c is None:  # lost before Connected: never counted as open
            u.conns[gen] = Conn(gen, self._node_of(order, ev.url, u), t, t, ev.code)

    def current_node(self, u: User) -> int | None:
        c = u.conns.get(u.client._gen)
        return None if c is None or c.t_close is not None else c.node

    async def connect_all(self) -> None:
        async with asyncio.timeout(90):
            await bounded((u.client.connect(timeout=60) for u in self.everyone), 20)

    async def close_all(self) -> None:
        await asyncio.gather(*(u.client.close() for u in self.everyone if hasattr(u, "client")),
                             return_exceptions=True)

    async def make_groups(self) -> None:
        """Groups over HTTP: group j holds a window of the users (they overlap)."""
        n = len(self.users)
        size = max(2, (2 * n) // 3)
        for j in range(self.cfg.groups):
            start = (j * n) // max(1, self.cfg.groups)
            members = [self.users[(start + k) % n] for k in range(size)]
            owner = members[0]
            r = await owner.client.http("POST", "/v1/groups", json={
                "name": f"nem{j}", "members": [m.name for m in members[1:]]})
            g = str(r["group"])
            self.group_members[g] = [m.name for m in members]
            for m in members:
                m.groups.append(g)

    async def _join(self, u: User) -> None:
        j = await u.client.join(self.room)
        u.room_log.append((now(), "joined", (j.reply, [m.get("pos") for m in j.msgs])))

    async def join_room(self) -> None:
        await bounded((self._join(u) for u in self.everyone), 20)

    # -- the traffic ----------------------------------------------------------------------
    async def _send(self, u: User, kind: str, to: str, k: int) -> None:
        cmid = f"{u.name}-{kind}-{to}-{k}"
        s = u.sends[cmid] = Send(cmid, kind, to, k, now())
        body = {"c": cmid, "k": k}
        try:
            if kind == "dm":
                a = await u.client.send(to, body, cmid=cmid)
            else:
                a = await u.client.group_send(to, body, cmid=cmid)
        except SendTimeout:
            s.error = "timeout"
            return
        except ServerError as exc:
            s.error = f"refused: {exc}"
            return
        except ClientStopped:
            s.error = "stopped"
            return
        except asyncio.CancelledError:
            s.error = "cancelled"
            raise
        s.t_ack, s.mid, s.seq, s.node = now(), a.mid, a.seq, self.current_node(u)

    async def _pump(self, u: User, kind: str, targets: list[str], interval: float) -> None:
        """Sends to ``targets`` in turn every ``interval``, each awaited (so a
        sender's sends to one target are sequential)."""
        counters: Counter[str] = Counter()
        due = now() + self.rng.random() * interval
        for i in itertools.count():
            await asyncio.sleep(max(0.0, due - now()))
            if self.stopping:
                return
            to = targets[i % len(targets)]
            await self._send(u, kind, to, counters[to])
            counters[to] += 1
            due = max(due + interval, now())

    async def _room_pump(self, u: User) -> None:
        interval = self.cfg.room_interval
        due = now() + self.rng.random() * interval
        for k in itertools.count():
            await asyncio.sleep(max(0.0, due - now()))
            if self.stopping:
                return
            if self.room not in u.client.rooms and not await self._rejoin(u):
                return
            if not await self._room_send(u, k):
                return
            due = max(due + interval, now())

    async def _rejoin(self, u: User) -> bool:
        """A join by the app after a rejoin was refused (the SDK forgot the room);
        False once the client is stopped."""
        try:
            await self._join(u)
            u.room_rejoins += 1
        except (ServerError, Disconnected, TimeoutError) as exc:
            u.room_errors[f"join: {type(exc).__name__}"] += 1
        except ClientStopped:
            return False
        return True

    async def _room_send(self, u: User, k: int) -> bool:
        """One room message, its outcome recorded; False once the client is stopped."""
        try:
            await u.client.room_send(self.room, {"u": u.name, "k": k})
            n = self.current_node(u)
            u.room_ok.append((now(), -1 if n is None else n))
        except ServerError as exc:
            u.room_errors[str(exc.frame.get("code"))] += 1
        except (Disconnected, TimeoutError):
            u.room_errors["no connection"] += 1
        except ClientStopped:
            return False
        return True

    def start_traffic(self) -> None:
        def spawn(job: Any) -> None:
            self._tasks.append(asyncio.create_task(job))

        for u in self.users:
            spawn(self._pump(u, "dm", [u.peer], self.cfg.dm_interval))
            if u.groups:
                spawn(self._pump(u, "group", u.groups, self.cfg.group_interval))
            spawn(self._room_pump(u))
        for p in self.probes:
            spawn(self._pump(p, "dm", [p.peer], 0.5))
            spawn(self._room_pump(p))
        if self.cfg.churn_interval > 0:
            spawn(self._churn())

    async def _churn(self) -> None:
        """A network blip now and then: a random user's socket dropped (no close
        frame), so devices also connect during the faults, not only before them."""
        while not self.stopping:
            await asyncio.sleep(self.cfg.churn_interval)
            u = self.rng.choice(self.users)
            conn = u.client.connection
            if conn is not None and not conn.closed:
                conn.abort()
                self.churned.append((now(), u.name))

    async def stop_traffic(self, drain_s: float = 30.0) -> int:
        """No new sends; those in flight get ``drain_s``. Returns how many pumps were
        cancelled."""
        self.stopping = True
        _, stuck = await asyncio.wait(self._tasks, timeout=drain_s)
        for t in stuck:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        return len(stuck)
