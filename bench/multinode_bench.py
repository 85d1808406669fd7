"""Multi-node benchmark: what the broker hop costs, and how long a kill -9 hurts.

Run from the repository root (it starts its own nodes, uses the local Redis,
RabbitMQ and MongoDB-compatible server, and cleans up after itself)::

    .venv/bin/python -m bench.multinode_bench      # 50 pairs, window 32, 10 s, 300 failover users

Phases, all in one run; each phase has its own namespace (Redis key prefix,
MongoDB database, RabbitMQ exchanges), dropped at the end:

1. **One node, saturation.** P sender->receiver pairs on one node, each
   sender keeping W sends in flight (closed loop; the load generator of
   ``bench/chat_bench.py``). After ``--warmup`` s, for ``--duration`` s:
   acks/s and deliveries/s (pushes received) of the messages sent in that
   window, and ack / delivery latency. In a closed loop the latency is mostly
   queueing (about P*W / rate): read it as "how deep the queue is", not as
   the latency of a lightly loaded node (``bench.chat_bench`` measures that).
2. **Three nodes, saturation.** Same P, W and timing, clients spread evenly:
   sender i on node i % 3, its receiver on node (i+1) % 3, so every push
   crosses RabbitMQ. Per node: acks/s of the senders connected to it,
   deliveries/s of the receivers connected to it, its CPU, and its own
   counters from ``/metrics``; then the totals. **Ratio** = 3-node total /
   1-node figure, for acks/s and deliveries/s. The issue's target is >= 0.8
   (the broker hop costs little). All processes share this machine's cores
   and one store, so more nodes add no capacity here: expect the total to
   stay near the one-node figure. A ratio below 1 is the hop, three
   processes competing for the same cores, or the store slowing down with
   more concurrent writers (each node has its own write batches in flight):
   compare the nodes' CPU (the hop's cost shows there) with the store's.
   Single runs vary by +-15% on this machine; compare several.
3. **Failover.** Three fresh nodes, ``--failover-clients`` users spread
   evenly (user i on node i % 3), each one WebSocket, sending to user i+1 (on
   another node) one message every ``--failover-interval`` s with at most one
   in flight: a send that is not acked (connection lost, ``unavailable``, no
   reply within 10 s) is resent with the same ``cmid``. After
   ``--failover-before`` s node 0 gets SIGKILL. Each of its clients, when its
   connection closes, reconnects to the surviving nodes round robin and
   resends. Sending stops ``--failover-after`` s after the kill (longer than
   the heartbeat TTL, so routes to the dead node have lapsed by then). Times
   from the kill, over the dead node's clients: (a) reconnected (handshake
   done), (b) first ack on the new node, (b') the same for those that had a
   send in flight (resent at once; the others wait for their next scheduled
   send); over the receivers on surviving nodes whose senders were on the
   dead node: (c) first push from that sender received after the sender
   reconnected; over the dead node's clients as
   receivers: (d) first push on their new connection. p50 / p95 / max, and
   how many never got there. Then users sync over HTTP (``GET
   /v1/sync?since=0``, every page): each user with an acked incoming message
   that no push brought, plus ``--sync-sample`` users spread over all nodes
   whose sync answer must hold every acked message they sent or received (a
   check of the sync path itself; ``--sync-all`` syncs everyone, slowly:
   ``since=0`` is served from MongoDB, about 0.5 s of SecantusDB per page at
   this size). The counts say whether every acked message reached its
   receiver: sent (distinct cmids), acked, received (by push, or only by
   sync), missing (acked, never received: should be 0). A per-second
   timeline around the kill (acks, pushes, reconnects, ack latency of the
   clients that did not move) shows the dip. ``--profile`` py-spies a
   surviving node for 4 s from the kill. The defaults (300 users, one send
   per 0.2 s) offer 1,500 msgs/s, more than a 2-core machine with SecantusDB
   stores (~700-900): the report then says the cluster was saturated and the
   times include queueing; ``--failover-interval 1`` leaves headroom.

Output: a markdown report on stdout; everything as JSON in
``bench/out/multinode-<UTC timestamp>.json``, node logs beside it. All traffic
goes to 127.0.0.1; every wait is bounded; nodes are stopped (or killed) in
``finally`` blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import secrets
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from bench import common
from bench.chat_bench import (
    LOOPBACK,
    Load,
    Meter,
    Receiver,
    Sender,
    _closed_loop,
    _load_lines,
    _node_env,
    _profile_lines,
    _redacted,
    dial,
    measure_window,
    stop_pumps,
    summarise,
)
from gateway.auth import issue_token

NODES = 3
ACK_TIMEOUT_S = 10.0  # failover: resend a send not answered within this
DRAIN_S = 10.0  # failover: bound on finishing the sends in flight after the stop
PUSH_SETTLE_S = 1.5  # failover: wait for the last pushes before the final sync
SYNC_LIMIT = 200
SYNC_CONCURRENCY = 2  # final sync: requests in flight over the surviving nodes
SYNC_RETRIES = 4
TARGET_RATIO = 0.8
fmt, md_table = common.fmt, common.md_table


# -- saturation (phases 1 and 2) -----------------------------------------------------
class NodeSender(Sender):
    """chat_bench's Sender, also counting acks of measured sends (per phase)."""

    def __init__(self, ws: ClientConnection, to: str, load: Load, node: int) -> None:
        super().__init__(ws, to, load)
        self.node = node
        self.acked: Counter[int] = Counter()

    def _on_frame(self, f: dict[str, Any]) -> None:
        if f.get("op") == "ack":
            entry = self.inflight.get(f.get("re"))
            if entry is not None and entry[1] is not None:
                self.acked[entry[1].phase] += 1
        super()._on_frame(f)


class NodeReceiver(Receiver):
    """chat_bench's Receiver, also counting pushes of measured sends (per phase)."""

    def __init__(self, ws: ClientConnection, load: Load, node: int) -> None:
        super().__init__(ws, load)
        self.node = node
        self.got: Counter[int] = Counter()

    def _on_frame(self, f: dict[str, Any]) -> None:
        body = f.get("body")
        if f.get("op") == "msg" and isinstance(body, dict):
            self.got[body.get("m", -1)] += 1
        super()._on_frame(f)


async def open_spread_load(ws_urls: list[str], secret: str, pairs: int, tag: str) -> Load:
    """Sender i on node i % n, its receiver on node (i+1) % n (the same node when n = 1)."""
    n, load = len(ws_urls), Load()
    receivers = await asyncio.gather(*(dial(ws_urls[(i + 1) % n], secret, f"{tag}-r{i}")
                                       for i in range(pairs)))
    senders = await asyncio.gather(*(dial(ws_urls[i % n], secret, f"{tag}-s{i}")
                                     for i in range(pairs)))
    load.receivers = [NodeReceiver(ws, load, (i + 1) % n) for i, ws in enumerate(receivers)]
    load.senders = [NodeSender(ws, f"{tag}-r{i}", load, i % n) for i, ws in enumerate(senders)]
    return load


async def saturation(load: Load, args: argparse.Namespace, names: dict[int, str],
                     nodes: list[common.NodeProcess], phase: int) -> dict[str, Any]:
    """Closed loop for warmup + duration; totals, then per node."""
    stats = load.begin_phase(phase)
    opens_at = time.perf_counter() + args.warmup
    until = opens_at + args.duration
    pumps = [asyncio.create_task(_closed_loop(s, args.window, until)) for s in load.senders]
    await asyncio.sleep(max(0.0, opens_at - time.perf_counter()))
    before = await asyncio.gather(*(common.fetch_metrics(n.http_url) for n in nodes))
    seconds, cpu = await measure_window(load, names, None, time.perf_counter(), until)
    after = await asyncio.gather(*(common.fetch_metrics(n.http_url) for n in nodes))
    cpu["stuck_senders"] = await stop_pumps(pumps)
    for s in load.senders:
        s.slots = None
    result = summarise(stats, seconds, cpu, await load.drain())
    deltas = [common.metrics_delta(b, a) for b, a in zip(before, after, strict=True)]
    if len(nodes) == 1:
        cpu["node_metrics"] = deltas[0]
    result["per_node"] = []
    for i, node in enumerate(nodes):
        acks = sum(s.acked[phase] for s in load.senders if isinstance(s, NodeSender)
                   and s.node == i)
        got = sum(r.got[phase] for r in load.receivers if isinstance(r, NodeReceiver)
                  and r.node == i)
        result["per_node"].append({
            "node": node.name, "pid": node.pid,
            "acks_per_s": round(acks / seconds, 1), "deliveries_per_s": round(got / seconds, 1),
            "cores": cpu["by_pid"].get(str(node.pid)), "metrics": deltas[i]})
    return result


async def saturation_phase(args: argparse.Namespace, run: Run, n_nodes: int,
                           phase: int) -> dict[str, Any]:
    ns = run.namespace(f"{n_nodes}n")
    nodes = await run.start_nodes(ns, n_nodes, f"sat{n_nodes}")
    try:
        names = {os.getpid(): "load generator (this process)"}
        names |= {n.pid: f"node {i} {n.name}" for i, n in enumerate(nodes)}
        load = await open_spread_load([n.ws_url for n in nodes], run.secret, args.pairs,
                                      f"{ns}-p")
        try:
            result = await saturation(load, args, names, nodes, phase)
            result["unexpected_frames"] = dict(load.other)
        finally:
            await load.close()
        result["namespace"] = ns
        return result
    finally:
        await run.stop_nodes(nodes)


# -- failover (phase 3) ----------------------------------------------------------------
@dataclass(eq=False)
class FoUser:
    """One failover client: one WebSocket, one send in flight."""

    name: str
    peer: str
    home: int
    token: str
    at: int = -1
    ws: ClientConnection | None = None
    gen: int = 0  # connections opened so far; 1 = the first
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: dict[int, asyncio.Future[dict[str, Any] | None]] = field(default_factory=dict)
    sent: int = 0  # distinct cmids put on the wire
    attempts: int = 0  # send frames, resends included
    acked: dict[str, tuple[int, int, float]] = field(default_factory=dict)  # cmid -> mid, gen, t
    got: dict[int, tuple[float | None, str, str]] = field(default_factory=dict)  # mid -> t,from,how
    dup_pushes: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    timeouts: int = 0
    connects: list[tuple[float, int]] = field(default_factory=list)  # (t, node)
    closes: list[float] = field(default_factory=list)
    synced: set[int] | None = None  # every mid of the final sync's answer, if synced
    lost_sends: list[float] = field(default_factory=list)  # a send in flight lost its connection


class Failover:
    """The failover load: users, their connections, and the kill."""

    def __init__(self, ws_urls: list[str], secret: str, n_users: int, interval: float,
                 tag: str) -> None:
        self.ws_urls = ws_urls
        self.secret = secret
        self.interval = interval
        n = len(ws_urls)
        self.users = [FoUser(f"{tag}-u{i}", f"{tag}-u{(i + 1) % n_users}", i % n,
                             issue_token(secret, f"{tag}-u{i}", 3600)) for i in range(n_users)]
        self.up = [True] * n
        self._rr = itertools.count()
        self._rids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self.stopping = False  # no new sends
        self.closing = False  # no reconnects
        self.hard_deadline = math.inf
        self.connect_failures: Counter[str] = Counter()
        self.other: Counter[str] = Counter()
        self.acks: list[tuple[float, float, int]] = []  # (t, since first send, home node)
        self.pushes_at: list[float] = []

    # -- connections -----------------------------------------------------------
    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _next_up(self) -> int:
        alive = [i for i, up in enumerate(self.up) if up]
        return alive[next(self._rr) % len(alive)]

    async def connect(self, u: FoUser, node: int | None = None) -> None:
        """To ``node`` (the first connection), else round robin over the nodes up."""
        failures = 0
        while not self.closing and time.perf_counter() < self.hard_deadline:
            i = node if node is not None else self._next_up()
            try:
                ws = await dial(self.ws_urls[i], self.secret, u.name, open_timeout=5)
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                self.connect_failures[type(exc).__name__] += 1
                failures += 1
                if node is not None and failures >= 10:
                    raise RuntimeError(f"{u.name} cannot connect to node {node}") from exc
                await asyncio.sleep(0.1)
                continue
            u.ws, u.at, u.gen = ws, i, u.gen + 1
            u.connects.append((time.perf_counter(), i))
            u.ready.set()
            self._spawn(self._read(u, ws))
            return

    async def _read(self, u: FoUser, ws: ClientConnection) -> None:
        try:
            async for data in ws:
                f = orjson.loads(data)
                op = f.get("op")
                if op == "msg":
                    self._on_push(u, f)
                elif op in ("ack", "error") and (fut := u.waiting.pop(f.get("re"), None)):
                    if not fut.done():
                        fut.set_result(f)
                else:
                    self.other[f"{op}:{f.get('code')}" if op == "error" else str(op)] += 1
        except ConnectionClosed:
            pass
        finally:
            if u.ws is ws:
                u.ready.clear()
                u.closes.append(time.perf_counter())
                for fut in u.waiting.values():
                    if not fut.done():
                        fut.set_result(None)
                u.waiting.clear()
                if not self.closing:
                    self._spawn(self.connect(u))

    def _on_push(self, u: FoUser, f: dict[str, Any]) -> None:
        t = time.perf_counter()
        mid = f.get("mid")
        if not isinstance(mid, int) or f.get("to") != u.name:
            self.other["msg:unexpected"] += 1
            return
        if mid in u.got:
            u.dup_pushes += 1
            return
        u.got[mid] = (t, str(f.get("from")), "push")
        self.pushes_at.append(t)

    # -- sending ---------------------------------------------------------------
    async def pump(self, u: FoUser, first_due: float) -> None:
        due, k = first_due, 0
        while not self.stopping:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            if self.stopping:
                return
            k += 1
            await self._deliver(u, f"c{k}", {"k": k, "t": time.perf_counter()})
            due = max(due + self.interval, time.perf_counter())

    async def _deliver(self, u: FoUser, cmid: str, body: dict[str, Any]) -> None:
        """Send until acked, resending the same cmid; give up at the hard deadline."""
        loop = asyncio.get_running_loop()
        first, t_first = True, 0.0
        while (left := self.hard_deadline - time.perf_counter()) > 0:
            try:
                await asyncio.wait_for(u.ready.wait(), left)
            except TimeoutError:
                return
            ws, gen = u.ws, u.gen
            assert ws is not None
            rid = next(self._rids)
            fut: asyncio.Future[dict[str, Any] | None] = loop.create_future()
            u.waiting[rid] = fut
            frame = {"op": "send", "id": rid, "to": u.peer, "cmid": cmid, "body": body}
            try:
                await ws.send(orjson.dumps(frame).decode())
            except ConnectionClosed:
                u.waiting.pop(rid, None)
                await asyncio.sleep(0.01)  # the reader notices and reconnects
                continue
            if first:
                u.sent, first, t_first = u.sent + 1, False, time.perf_counter()
            u.attempts += 1
            try:
                reply = await asyncio.wait_for(fut, min(ACK_TIMEOUT_S, max(0.01, left)))
            except TimeoutError:
                u.waiting.pop(rid, None)
                u.timeouts += 1
                continue
            if reply is None:  # connection lost: resend once reconnected
                u.lost_sends.append(time.perf_counter())
                continue
            if reply.get("op") == "ack":
                t = time.perf_counter()
                u.acked[cmid] = (int(reply["mid"]), gen, t)
                self.acks.append((t, t - t_first, u.home))
                return
            code = str(reply.get("code"))
            u.errors[code] += 1
            if code not in ("unavailable", "rate_limited"):
                return  # not worth retrying
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        self.closing = True
        conns = [u.ws for u in self.users if u.ws is not None]
        await asyncio.gather(*(ws.close() for ws in conns), return_exceptions=True)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- final sync --------------------------------------------------------------
    async def final_sync(self, users: list[FoUser], http_urls: list[str],
                         timeout_s: float) -> dict[str, Any]:
        """``GET /v1/sync?since=0``, all pages, for ``users``; adds what pushes missed
        and keeps every mid returned (``u.synced``) for the cross-check.

        ``since=0`` is older than any offline store's floor, so the node answers
        from the MongoDB boxes, which is slow on SecantusDB: few requests at a
        time, a 503 (the node's store timeout) is retried, every page is timed.
        """
        sem = asyncio.Semaphore(SYNC_CONCURRENCY)
        failures: Counter[str] = Counter()
        pages, retries = 0, 0
        page_s: list[float] = []

        async def get(client: httpx.AsyncClient, url: str, u: FoUser,
                      since: int) -> dict[str, Any]:
            nonlocal retries
            for attempt in range(SYNC_RETRIES + 1):
                t = time.perf_counter()
                r = await client.get(url, params={"since": since, "limit": SYNC_LIMIT},
                                     headers={"Authorization": f"Bearer {u.token}"})
                if r.status_code == 503 and attempt < SYNC_RETRIES:
                    retries += 1
                    await asyncio.sleep(1.0)
                    continue
                r.raise_for_status()
                page_s.append(time.perf_counter() - t)
                return dict(r.json())
            raise AssertionError("unreachable")

        async def one(client: httpx.AsyncClient, u: FoUser, base: str) -> None:
            nonlocal pages
            since, u.synced = 0, set()
            async with sem:
                for _ in range(1000):
                    page = await get(client, f"{base}/v1/sync", u, since)
                    pages += 1
                    for m in page["msgs"]:
                        u.synced.add(m["mid"])
                        if m.get("to") == u.name and m["mid"] not in u.got:
                            u.got[m["mid"]] = (None, str(m.get("from")), "sync")
                    if not page["more"]:
                        return
                    if page["next"] <= since:
                        failures["cursor did not move"] += 1
                        return
                    since = page["next"]

        started = time.perf_counter()
        async with httpx.AsyncClient(timeout=15, trust_env=False) as client:
            jobs = [one(client, u, http_urls[i % len(http_urls)]) for i, u in enumerate(users)]
            try:
                async with asyncio.timeout(timeout_s):
                    results = await asyncio.gather(*jobs, return_exceptions=True)
            except TimeoutError:
                results = [TimeoutError(f"final sync took over {timeout_s:.0f} s")]
        for r in results:
            if isinstance(r, BaseException):
                failures[f"{type(r).__name__}: {str(r).splitlines()[0][:100] if str(r) else ''}"
                         ] += 1
        return {"users": len(users), "pages": pages, "retries_after_503": retries,
                "seconds": round(time.perf_counter() - started, 2), "failures": dict(failures),
                "page_latency": common.latency_summary(page_s, (50, 99))}


def _first_after(times: list[float], t0: float) -> float | None:
    later = [t for t in times if t >= t0]
    return min(later) if later else None


def _timing(samples: list[float | None]) -> dict[str, Any]:
    """Seconds after the kill (None = never) -> count, p50/p95/max in ms, how many never."""
    reached = [s for s in samples if s is not None]
    out = common.latency_summary(reached, (50, 95))
    out["clients"], out["never"] = len(samples), len(samples) - len(reached)
    return out


def _sync_check(fo: Failover) -> dict[str, Any]:
    """Users whose final sync answered: acked messages of theirs (in or out) it lacked."""
    synced = [u for u in fo.users if u.synced is not None]
    incoming: dict[str, set[int]] = {u.name: set() for u in fo.users}
    for u in fo.users:
        for mid, _, _ in u.acked.values():
            incoming[u.peer].add(mid)
    absent = 0
    for u in synced:
        assert u.synced is not None
        expected = incoming[u.name] | {mid for mid, _, _ in u.acked.values()}
        absent += len(expected - u.synced)
    return {"synced_users": len(synced), "synced_acked_absent": absent}


def analyse(fo: Failover, victim: int, t_kill: float, t_stop: float,
            t_start: float) -> dict[str, Any]:
    users = {u.name: u for u in fo.users}
    by_push = only_sync = 0
    missing: list[dict[str, Any]] = []
    acked_mids: set[int] = set()
    for u in fo.users:
        r = users[u.peer]
        for cmid, (mid, gen, _) in u.acked.items():
            acked_mids.add(mid)
            got = r.got.get(mid)
            if got is None:
                missing.append({"from": u.name, "to": r.name, "cmid": cmid, "mid": mid,
                                "acked_on_connection": gen})
            elif got[2] == "push":
                by_push += 1
            else:
                only_sync += 1
    unacked = sum(1 for u in fo.users for mid in u.got if mid not in acked_mids)
    errors: Counter[str] = Counter()
    for u in fo.users:
        errors.update(u.errors)
    sent, acked = sum(u.sent for u in fo.users), sum(len(u.acked) for u in fo.users)
    counts = {"sent": sent, "acked": acked, "received": by_push + only_sync,
              "received_by_push": by_push, "received_only_by_sync": only_sync,
              "missing": len(missing), "missing_first": missing[:20],
              "received_never_acked": unacked,
              "duplicate_pushes": sum(u.dup_pushes for u in fo.users),
              "resends": sum(u.attempts for u in fo.users) - sent,
              "ack_timeouts": sum(u.timeouts for u in fo.users), "errors": dict(errors),
              "connect_failures": dict(fo.connect_failures), "unexpected_frames": dict(fo.other),
              **_sync_check(fo)}

    dead = [u for u in fo.users if u.home == victim]
    closed, reconnected, first_ack, moved_sender, moved_receiver = [], [], [], [], []
    first_ack_resent: list[float | None] = []
    for u in dead:
        t_close = _first_after(u.closes, t_kill)
        t_re = _first_after([t for t, _ in u.connects], t_kill)
        t_ack = min((t for _, gen, t in u.acked.values() if gen >= 2), default=None)
        closed.append(None if t_close is None else t_close - t_kill)
        reconnected.append(None if t_re is None else t_re - t_kill)
        first_ack.append(None if t_ack is None else t_ack - t_kill)
        if _first_after(u.lost_sends, t_kill) is not None:
            first_ack_resent.append(first_ack[-1])
        r = users[u.peer]
        pushes_from = [t for t, frm, how in r.got.values() if how == "push" and frm == u.name
                       and t is not None]
        pushes_to = [t for t, _, how in u.got.values() if how == "push" and t is not None]
        if r.home != victim:
            t = None if t_re is None else _first_after(pushes_from, t_re)
            moved_sender.append(None if t is None else t - t_kill)
        t = None if t_re is None else _first_after(pushes_to, t_re)
        moved_receiver.append(None if t is None else t - t_kill)
    timings = {"connection_closed": _timing(closed), "reconnected": _timing(reconnected),
               "first_ack_on_new_node": _timing(first_ack),
               "first_ack_on_new_node_resent": _timing(first_ack_resent),
               "first_push_from_moved_sender": _timing(moved_sender),
               "first_push_to_moved_receiver": _timing(moved_receiver)}
    new_node = Counter(u.at for u in dead)

    def rate(ts: list[float], a: float, b: float) -> float | None:
        return round(sum(1 for t in ts if a <= t < b) / (b - a), 1) if b > a else None

    settle = t_kill + (t_stop - t_kill) / 2
    ack_times = [t for t, _, _ in fo.acks]
    rates = {"acks_per_s_before_kill": rate(ack_times, t_start + 1, t_kill),
             "pushes_per_s_before_kill": rate(fo.pushes_at, t_start + 1, t_kill),
             "acks_per_s_second_half_after_kill": rate(ack_times, settle, t_stop),
             "pushes_per_s_second_half_after_kill": rate(fo.pushes_at, settle, t_stop)}
    reconnect_times = [t for u in fo.users for t, _ in u.connects if t >= t_kill]
    timeline = []
    for s in range(round(t_start - t_kill), round(t_stop - t_kill)):
        a, b = t_kill + s, t_kill + s + 1
        acks = [(lat, home) for t, lat, home in fo.acks if a <= t < b]
        stayed = sorted(lat for lat, home in acks if home != victim)
        p50 = common.percentile(stayed, 50)
        timeline.append({
            "s": s, "acks": len(acks), "acks_moved": sum(1 for _, h in acks if h == victim),
            "pushes": sum(1 for t in fo.pushes_at if a <= t < b),
            "reconnects": sum(1 for t in reconnect_times if a <= t < b),
            "ack_p50_ms_stayed": None if p50 is None else round(p50 * 1000),
            "ack_max_ms_stayed": round(stayed[-1] * 1000) if stayed else None})
    return {"counts": counts, "timings": timings, "rates": rates, "timeline": timeline,
            "dead_node_clients": len(dead),
            "dead_node_clients_now_on": {str(k): v for k, v in sorted(new_node.items())}}


def sync_targets(fo: Failover, everyone: bool, sample: int) -> list[FoUser]:
    """Who syncs at the end: every user with an acked incoming message no push
    brought (needed for the check), plus ``sample`` users spread over all nodes
    (they cross-check the sync path itself); or everyone."""
    if everyone:
        return list(fo.users)
    by_name = {u.name: u for u in fo.users}
    needed = {u.peer for u in fo.users
              if any(mid not in by_name[u.peer].got for mid, _, _ in u.acked.values())}
    step = max(1, len(fo.users) // max(1, sample))
    picked = {u.name for u in fo.users[::step][:sample]} if sample > 0 else set()
    return [u for u in fo.users if u.name in needed | picked]


async def failover_phase(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    ns = run.namespace("fo")
    nodes = await run.start_nodes(ns, NODES, "failover")
    victim = 0
    fo = Failover([n.ws_url for n in nodes], run.secret, args.failover_clients,
                  args.failover_interval, f"{ns}-f")
    names = {os.getpid(): "load generator (this process)"}
    names |= {n.pid: f"node {i} {n.name}" for i, n in enumerate(nodes)}
    res: dict[str, Any] = {"namespace": ns, "nodes": [n.name for n in nodes],
                           "victim": nodes[victim].name, "users": len(fo.users),
                           "interval_s": args.failover_interval,
                           "offered_per_s": round(len(fo.users) / args.failover_interval, 1)}
    pumps: list[asyncio.Task[None]] = []
    try:
        sem = asyncio.Semaphore(50)

        async def first(u: FoUser) -> None:
            async with sem:
                await fo.connect(u, u.home)

        async with asyncio.timeout(120):
            await asyncio.gather(*(first(u) for u in fo.users))
        t_start = time.perf_counter() + 0.05
        pumps = [asyncio.create_task(fo.pump(u, t_start + args.failover_interval * i /
                                             len(fo.users))) for i, u in enumerate(fo.users)]
        await asyncio.sleep(1.05)
        meter = Meter(names)
        await asyncio.sleep(max(0.0, t_start + args.failover_before - time.perf_counter()))
        res["cpu_before_kill"] = meter.stop()[1]
        fo.up[victim] = False
        t_kill = time.perf_counter()
        nodes[victim].kill()
        meter = Meter(names)
        profile = None
        if args.profile:  # a survivor, for the seconds right after the kill
            out = common.OUT_DIR / f"pyspy-multinode-{args.stamp}.txt"
            profile = asyncio.create_task(common.py_spy_record(nodes[1].pid, 4, out))
        with contextlib.suppress(TimeoutError):
            assert nodes[victim].proc is not None
            res["victim_exit_code"] = await asyncio.wait_for(nodes[victim].proc.wait(), 5)
        await asyncio.sleep(max(0.0, t_kill + args.failover_after - time.perf_counter()))
        res["cpu_after_kill"] = meter.stop()[1]
        t_stop = time.perf_counter()
        fo.stopping, fo.hard_deadline = True, t_stop + DRAIN_S
        res["stuck_senders"] = await stop_pumps(pumps)
        await asyncio.sleep(PUSH_SETTLE_S)
        await fo.close()
        survivors = [n for i, n in enumerate(nodes) if i != victim]
        res["survivor_metrics"] = {n.name: common.metrics_delta({}, await common.fetch_metrics(
            n.http_url)) for n in survivors}
        res["final_sync"] = await fo.final_sync(
            sync_targets(fo, args.sync_all, args.sync_sample), [n.http_url for n in survivors],
            timeout_s=max(180.0, 2.0 * len(fo.users)))
        if profile is not None:
            res["profile"] = await profile
        res.update(analyse(fo, victim, t_kill, t_stop, t_start))
        return res
    finally:
        for t in pumps:
            t.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        await fo.close()
        await run.stop_nodes(nodes)


# -- the run: nodes, namespaces, cleanup ------------------------------------------------
class Run:
    """What one benchmark run started and must clean up."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.secret = secrets.token_hex(32)
        self.base = common.new_namespace()
        self.namespaces: list[str] = []
        self.nodes: list[dict[str, Any]] = []

    def namespace(self, suffix: str) -> str:
        ns = self.base + suffix
        self.namespaces.append(ns)
        return ns

    async def start_nodes(self, ns: str, n: int, label: str) -> list[common.NodeProcess]:
        env = {**_node_env(self.args, ns, self.secret), "IM_AMQP_URL": self.args.amqp_url}
        nodes: list[common.NodeProcess] = []
        try:
            for i in range(n):
                log = common.OUT_DIR / f"multinode-{self.args.stamp}-{label}-{i}.log"
                nodes.append(common.NodeProcess(env, log))
                await nodes[-1].start()
        except BaseException:
            await self.stop_nodes(nodes)
            raise
        return nodes

    async def stop_nodes(self, nodes: list[common.NodeProcess]) -> None:
        """SIGTERM (drain) every node still running; note exit codes and log findings."""
        codes = await asyncio.gather(*(n.stop() for n in nodes), return_exceptions=True)
        for n, code in zip(nodes, codes, strict=True):
            self.nodes.append({
                "log": str(n.log_path), "name": n.name,
                "pid": n.proc.pid if n.proc else None,
                "exit_code": code if not isinstance(code, BaseException) else repr(code),
                "log_findings": common.log_findings(n.log_path)})

    async def cleanup(self) -> dict[str, Any]:
        a, out = self.args, {}
        for ns in self.namespaces:
            done: dict[str, Any] = {}
            for what, job in (("mongo", lambda ns=ns: common.drop_databases(a.mongo_url, [ns])),
                              ("redis_keys", lambda ns=ns: common.delete_redis_keys(
                                  a.redis_url, ns)),
                              ("exchanges", lambda ns=ns: common.delete_exchanges(
                                  a.amqp_url, ns))):
                try:
                    async with asyncio.timeout(120):
                        done[what] = await job()
                except Exception as exc:  # noqa: BLE001 - reported; the results still matter
                    done[what] = f"failed: {exc!r}"
            out[ns] = done
        return out


# -- report ----------------------------------------------------------------------------
def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def ratios(one: dict[str, Any], three: dict[str, Any]) -> dict[str, Any]:
    return {"acks": _ratio(three["acks_per_s"], one["acks_per_s"]),
            "deliveries": _ratio(three["deliveries_per_s"], one["deliveries_per_s"]),
            "target": TARGET_RATIO}


def _per_node_lines(r: dict[str, Any]) -> list[str]:
    rows = []
    for i, n in enumerate(r["per_node"]):
        c = n["metrics"]["counters"]
        errors = sum(v for k, v in c.items() if k.startswith("im_errors_total"))
        rows.append([f"{i} {n['node']}", n["acks_per_s"], n["deliveries_per_s"], n["cores"],
                     c.get('im_sends_total{outcome="stored"}', 0), c.get("im_pushes_total", 0),
                     n["metrics"]["mean_batch_size"].get("mongo"), errors])
    rows.append(["**total**", r["acks_per_s"], r["deliveries_per_s"],
                 round(sum(n["cores"] or 0 for n in r["per_node"]), 3),
                 sum(row[4] for row in rows), sum(row[5] for row in rows), None,
                 sum(row[7] for row in rows)])
    header = ["node", "acks/s (its senders)", "deliveries/s (its receivers)", "CPU cores",
              "node: sends stored", "node: pushes written", "node: mean Mongo batch",
              "node: error replies"]
    return ["Per node (client-side rates; node counters over the same window):", ""] + \
        md_table(header, rows)


def _ratio_lines(res: dict[str, Any]) -> list[str]:
    one, three, rt = res["one_node"], res["three_nodes"], res["ratios"]

    def lat(r: dict[str, Any], which: str) -> str:
        s = r[which]
        return f"{fmt(s['p50_ms'])} / {fmt(s['p99_ms'])}"

    rows = [["acks/s", one["acks_per_s"], three["acks_per_s"], rt["acks"]],
            ["deliveries/s", one["deliveries_per_s"], three["deliveries_per_s"],
             rt["deliveries"]],
            ["ack latency p50 / p99 (ms)", lat(one, "ack_latency"),
             lat(three, "ack_latency"), None],
            ["delivery latency p50 / p99 (ms)", lat(one, "delivery_latency"),
             lat(three, "delivery_latency"), None],
            ["machine CPU busy %", one["cpu"]["machine_busy_pct"],
             three["cpu"]["machine_busy_pct"], None]]
    verdict = ("meets" if min(rt["acks"] or 0, rt["deliveries"] or 0) >= TARGET_RATIO
               else "misses")
    return (["## Ratios: 3 nodes / 1 node", ""]
            + md_table(["figure", "1 node", "3 nodes", "ratio"], rows)
            + [f"Target ratio >= {TARGET_RATIO}: this run **{verdict}** it "
               f"(acks {fmt(rt['acks'])}, deliveries {fmt(rt['deliveries'])}).", ""])


_TIMING_LABELS = {
    "connection_closed": "(0) dead node's clients: connection close seen",
    "reconnected": "(a) dead node's clients: reconnected (handshake done)",
    "first_ack_on_new_node": "(b) dead node's clients: first ack on the new node",
    "first_ack_on_new_node_resent": "(b') ... of those that had a send in flight (resent at "
                                    "once)",
    "first_push_from_moved_sender": "(c) receivers on survivors: first push from their "
                                    "moved sender",
    "first_push_to_moved_receiver": "(d) dead node's clients as receivers: first push on the "
                                    "new connection",
}


def _failover_lines(f: dict[str, Any]) -> list[str]:
    lines = ["## 3. Failover (kill -9 of one of three nodes)", "",
             f"{f['users']} users, one send per {f['interval_s']} s each, at most one in "
             f"flight (offered {fmt(f['offered_per_s'])} msgs/s); killed "
             f"{f['victim']} (exit code {f.get('victim_exit_code')}); its "
             f"{f['dead_node_clients']} clients moved to nodes "
             f"{f['dead_node_clients_now_on']} (by index).", ""]
    achieved = f["rates"]["acks_per_s_before_kill"] or 0.0
    if achieved < 0.9 * f["offered_per_s"]:
        lines += [f"Note: before the kill the cluster acked {fmt(achieved)} msgs/s of the "
                  f"{fmt(f['offered_per_s'])} offered: it was saturated, so sends queued and "
                  "the times below include that queueing (a larger --failover-interval "
                  "measures an unloaded cluster).", ""]
    rows = [[_TIMING_LABELS[k], t["clients"], t["never"], t["p50_ms"], t["p95_ms"],
             t["max_ms"]] for k, t in f["timings"].items()]
    lines += md_table(["time from the kill", "clients", "never", "p50 ms", "p95 ms",
                       "max ms"], rows)
    lines += ["(b), (c) and (d) include, for a client with nothing in flight at the kill, the "
              f"wait for its next scheduled send (up to {f['interval_s']} s); (b') leaves those "
              "out.", ""]
    c, fs = f["counts"], f["final_sync"]
    rows = [["sent (distinct cmids)", c["sent"]], ["acked", c["acked"]],
            ["received (push or final sync)", c["received"]],
            ["... by push", c["received_by_push"]],
            ["... only by the final sync", c["received_only_by_sync"]],
            ["**missing** (acked, never received)", c["missing"]],
            ["received but never acked to the sender", c["received_never_acked"]],
            ["duplicate pushes", c["duplicate_pushes"]],
            ["resends (same cmid)", c["resends"]], ["ack timeouts", c["ack_timeouts"]],
            ["error replies", ", ".join(f"{k}={v}" for k, v in c["errors"].items()) or "none"],
            ["failed connection attempts",
             ", ".join(f"{k}={v}" for k, v in c["connect_failures"].items()) or "none"],
            ["final sync", f"{fs['users']} users, {fs['pages']} pages in "
                           f"{fmt(fs['seconds'])} s (page p50 / p99 "
                           f"{fmt(fs['page_latency']['p50_ms'])} / "
                           f"{fmt(fs['page_latency']['p99_ms'])} ms), 503s retried: "
                           f"{fs['retries_after_503']}, failures: {fs['failures'] or 'none'}"],
            ["synced users: their acked messages (in or out) absent from the sync",
             f"{c['synced_acked_absent']} (over {c['synced_users']} users)"]]
    rt = f["rates"]
    rows += [["acks/s before the kill", rt["acks_per_s_before_kill"]],
             ["acks/s, second half after the kill", rt["acks_per_s_second_half_after_kill"]],
             ["pushes/s before / second half after",
              f"{fmt(rt['pushes_per_s_before_kill'])} / "
              f"{fmt(rt['pushes_per_s_second_half_after_kill'])}"]]
    for key, label in (("cpu_before_kill", "before"), ("cpu_after_kill", "after")):
        cpu = f[key]
        top = ", ".join(f"{p['what'][:24]} {p['cores']:.2f}" for p in cpu["top"][:4])
        rows.append([f"CPU {label} the kill: machine busy % / top cores",
                     f"{fmt(cpu['machine_busy_pct'])} / {top}"])
    lines += md_table(["delivery check", "value"], rows)
    if c["missing_first"]:
        lines += ["Missing (first 20): " + ", ".join(
            f"{m['from']}->{m['to']} {m['cmid']} mid {m['mid']}" for m in c["missing_first"]),
            ""]
    tl = f["timeline"]
    lines += ["Timeline, per second from the kill (s = 0 is the first second after it):", ""]
    lines += md_table(["s"] + [str(x["s"]) for x in tl],
                      [["acks"] + [x["acks"] for x in tl],
                       ["... of moved clients"] + [x["acks_moved"] for x in tl],
                       ["pushes"] + [x["pushes"] for x in tl],
                       ["reconnects"] + [x["reconnects"] for x in tl],
                       ["ack p50 ms, clients that stayed"] + [x["ack_p50_ms_stayed"] for x in tl],
                       ["ack max ms, clients that stayed"] + [x["ack_max_ms_stayed"] for x in tl]])
    lines += ["(ack latency = first send of a message -> its ack, resends included; the "
              "timeline counts acks when they arrive.)", ""]
    return lines + _profile_lines(f.get("profile"))


def _node_log_lines(nodes: list[dict[str, Any]]) -> list[str]:
    rows = []
    for n in nodes:
        lf = n["log_findings"]
        top = "; ".join(f"{t['count']}x {t['line'][:90]}" for t in lf["top"][:3]) or "-"
        rows.append([n["name"] or "?", n["exit_code"], lf["warnings"], lf["errors"],
                     lf["tracebacks"], top])
    return (["## Node logs", ""]
            + md_table(["node", "exit code", "warnings", "errors", "tracebacks",
                        "most frequent"], rows))


def render(res: dict[str, Any]) -> str:
    m, s = res["machine"], res["settings"]
    lines = ["# Multi-node benchmark", "", f"`{res['command']}`", "",
             f"- machine: {m['nproc']} CPUs, {m['cpu_model']}, Python {m['python']}, "
             f"kernel {m['kernel']}, load avg at start {m['loadavg_at_start'][0]:.2f}; every "
             "node, the load generator, Redis, RabbitMQ and the store share these CPUs",
             f"- code: commit {res['code']['commit']}, uncommitted changes in "
             f"{len(res['code']['uncommitted_in_gateway_router_store'])} gateway/router/store "
             "files",
             f"- saturation: pairs {s['pairs']}, window {s['window']}, duration "
             f"{s['duration']} s, warmup {s['warmup']} s; failover: {s['failover_clients']} "
             f"users, interval {s['failover_interval']} s, kill after "
             f"{s['failover_before']} s, run on {s['failover_after']} s; node heartbeat "
             "defaults (IM_HEARTBEAT_S 2, IM_HEARTBEAT_TTL_S 6)",
             f"- namespaces: {', '.join(res['namespaces'])}", ""]
    for key, title in (("one_node", "1. One node, saturation (closed loop)"),
                       ("three_nodes", "2. Three nodes, saturation (every push crosses "
                                       "RabbitMQ)")):
        r = res.get(key)
        if r is None:
            continue
        if "error" in r:
            lines += [f"## {title}", "", f"**failed**: {r['error']}", ""]
            continue
        lines += _load_lines(title, r)
        if key == "three_nodes":
            lines += _per_node_lines(r)
    if res.get("ratios"):
        lines += _ratio_lines(res)
    f = res.get("failover")
    if f is not None:
        lines += (_failover_lines(f) if "error" not in f else
                  ["## 3. Failover", "", f"**failed**: {f['error']}", ""])
    lines += _node_log_lines(res["nodes"])
    bad = {ns: d for ns, d in res["cleanup"].items()
           if any(isinstance(v, str) for v in d.values())}
    lines += [f"Cleanup: {'done' if not bad else bad}", "", f"Results: `{res['json']}`"]
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.multinode_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=50, help="sender->receiver pairs (default 50)")
    p.add_argument("--window", type=int, default=32, help="in-flight sends per sender")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per phase")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    p.add_argument("--failover-clients", type=int, default=300, help="users in phase 3")
    p.add_argument("--failover-interval", type=float, default=0.2,
                   help="seconds between one user's sends in phase 3 (default 0.2)")
    p.add_argument("--failover-before", type=float, default=5.0,
                   help="seconds of traffic before the kill (default 5)")
    p.add_argument("--failover-after", type=float, default=15.0,
                   help="seconds of traffic after the kill (default 15)")
    p.add_argument("--sync-sample", type=int, default=12,
                   help="phase 3: users synced at the end besides those a push missed "
                        "(default 12)")
    p.add_argument("--sync-all", action="store_true",
                   help="phase 3: every user syncs at the end (slow: since=0 is served by "
                        "MongoDB)")
    p.add_argument("--profile", action="store_true",
                   help="phase 3: py-spy a surviving node for 4 s from the kill")
    p.add_argument("--skip-saturation", action="store_true", help="phase 3 only")
    p.add_argument("--skip-failover", action="store_true", help="phases 1 and 2 only")
    p.add_argument("--mongo-url", default="mongodb://127.0.0.1:27017")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--amqp-url", default=common.DEFAULT_AMQP_URL)
    args = p.parse_args(argv)
    for url in (args.mongo_url, args.redis_url, args.amqp_url):
        if urlsplit(url).hostname not in LOOPBACK:
            p.error(f"{url}: only 127.0.0.1 is allowed")
    if min(args.pairs, args.window) < 1 or args.duration <= 0 or args.warmup < 0:
        p.error("--pairs and --window must be >= 1, --duration > 0, --warmup >= 0")
    if args.failover_clients < 2 * NODES or args.failover_interval <= 0:
        p.error(f"--failover-clients must be >= {2 * NODES}, --failover-interval > 0")
    if args.failover_before < 2 or args.failover_after < 2:
        p.error("--failover-before and --failover-after must be >= 2 s")
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    r = Run(args)
    keys = ("pairs", "window", "duration", "warmup", "failover_clients", "failover_interval",
            "failover_before", "failover_after", "mongo_url", "redis_url")
    res: dict[str, Any] = {
        "command": ".venv/bin/python -m bench.multinode_bench " + shlex.join(
            _redacted(args.argv)),
        "utc": args.stamp, "machine": common.machine_facts(), "code": args.code,
        "settings": {k: getattr(args, k) for k in keys}, "namespaces": r.namespaces}
    common.OUT_DIR.mkdir(parents=True, exist_ok=True)
    phases: list[tuple[str, Any]] = []
    if not args.skip_saturation:
        phases += [("one_node", lambda: saturation_phase(args, r, 1, 1)),
                   ("three_nodes", lambda: saturation_phase(args, r, NODES, 2))]
    if not args.skip_failover:
        phases.append(("failover", lambda: failover_phase(args, r)))
    try:
        for key, phase in phases:
            try:
                res[key] = await phase()
            except Exception as exc:  # noqa: BLE001 - reported; later phases still run
                res[key] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    finally:
        res["nodes"] = r.nodes
        res["cleanup"] = await r.cleanup()
    one, three = res.get("one_node"), res.get("three_nodes")
    if one and three and "error" not in one and "error" not in three:
        res["ratios"] = ratios(one, three)
    return res


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.stamp = common.utc_stamp()
    args.code = common.code_version()
    res = common.run_loop(run(args))
    res["json"] = str(common.write_json(res, args.stamp, "multinode"))
    print(render(res))
    failed = any("error" in res.get(k, {}) for k in ("one_node", "three_nodes", "failover"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
