"""The client process of ``bench.many_conns`` and ``bench.conn_memory``: up to
~17,000 WebSockets in one process, all from one loopback source address, started as

    python -m bench.many_clients --urls ws://127.0.0.1:P1/ws,... --source-ip 127.0.0.2 \
        --prefix P --first G

Connection ``i`` of this process is global connection ``g = G + i``: user
``P<g>`` with its own token (``MANY_CONNS_SECRET``), on node ``g % len(urls)``.
Sockets are ``testkit.lean`` ones (no task per socket, framing by hand); each is
bound to ``--source-ip`` before it connects (``IP_BIND_ADDRESS_NO_PORT``: the
port is picked at connect time per destination, so the ~28,000 ephemeral ports
are reused across nodes). Commands come as JSON lines on stdin, each answered by
one JSON line on stdout:

- ``{"cmd":"open","count":K}``: open K more connections, ``--concurrency``
  handshakes at once, each tried up to ``--tries`` times (retries and failures
  counted by kind, never hidden); answers counts, seconds and the handshake
  latency histogram (TCP connect to the ``101``).
- ``{"cmd":"hold","until":T,...}``: until ``T`` (``time.time()``), every open
  connection sends an app-level ``ping`` every ``ping_every`` s (one scheduler
  for the process: the connections in a random order, evenly spaced over the
  period, sent in 50 ms ticks); RTT to ``pong``. Meanwhile 1:1 sends, paced at
  ``chat_rate``/s over ``pairs`` sender -> receiver pairs (the receiver: the
  sender's next connection, so on another node; the senders spread over the
  nodes); ack = send -> ``ack``, delivery = send -> the receiver's ``msg``.
  ``room_members`` connections (spread likewise) join room ``room``; with
  ``room_rate`` one of them sends ``room_send`` at that rate, and every member
  counts the ``room_msgs`` it gets. Answers once ``T`` has passed and what is
  outstanding has drained (at most ``drain`` s).
- ``{"cmd":"ping","sample":S}``: a WebSocket ping to S of the open connections,
  spread evenly; answers how many ponged within 10 s (``bench.conn_memory``: proof
  an idle connection is still served; nothing else is ever sent on it).
- ``{"cmd":"storm","http":URL,"spread":S}``: every dropped connection dials
  again after a random delay within S s, then syncs over HTTP
  (``bench.reconnect_storm``); answers counts and times.
- ``{"cmd":"state"}``: open connections (per node), drops so far.
- ``{"cmd":"close"}``: from now on a closed socket is the benchmark's doing;
  close all, answer and exit.

A **drop** is a held connection (opened, not yet told to close) whose socket
closed or got a close frame: counted by kind and node, with the first times.
Latencies go into log histograms (``bench.stats.LogHist``, as ``bench.room_client``;
merged and summarised by the benchmark with ``bench.stats``).
Every wait is bounded; EOF on stdin closes everything.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import sys
import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from imgate_client.core import encode, make, with_token
from websockets.frames import Opcode

from bench.cli import check_loopback
from bench.common import emit, own_cpu, raise_fd_limit, run_loop, stdin_lines
from bench.stats import LogHist
from testkit.lean import LeanSocket
from testkit.tokens import issue_token

SECRET_ENV = "MANY_CONNS_SECRET"
TICK_S = 0.05  # ping scheduler slot
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)
TEXT = "hello from the many-connections benchmark"


class Conn(LeanSocket):
    """One held connection; frames go to the process's ``Clients``."""

    owner: Clients  # the one per process (a class attribute: no slot per socket)

    def __init__(self, host: str, port: int, path: str, g: int, node: int) -> None:
        super().__init__(host, port, path)
        self.g, self.node = g, node
        self.held = False
        self.ping_id = 0  # outstanding ping's id, 0: none
        self.ping_at = 0.0

    def on_text(self, payload: bytes, now: float) -> None:
        self.owner.frame(self, payload, now)

    def on_close_frame(self, payload: bytes) -> None:
        code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
        self.owner.dropped(self, f"close frame {code} {payload[2:60]!r}")

    def on_lost(self, exc: Exception | None) -> None:
        self.owner.dropped(self, f"lost: {type(exc).__name__ if exc else 'EOF'}")


def error_kind(exc: BaseException) -> str:
    """What a failed attempt looked like, for the counts."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    text = str(exc)
    if text.startswith("upgrade refused: b'HTTP/1.1 "):
        return "http " + text[len("upgrade refused: b'HTTP/1.1 "):][:3]
    if text.startswith("closed before it was ready"):
        inner = text.partition("(")[2].removesuffix(")")  # repr of the socket's exception
        return "closed before 101: " + ("EOF" if inner == "None" else inner.partition("(")[0])
    return type(exc).__name__ + (f" errno {exc.errno}" if isinstance(exc, OSError)
                                 and exc.errno else "")


class Clients:
    """The connections of this process and the counts of its traffic."""

    def __init__(self, args: argparse.Namespace, secret: str) -> None:
        self.args = args
        self.urls = [urlsplit(u) for u in args.urls.split(",")]
        self.secret = secret
        self.slots = asyncio.Semaphore(args.concurrency)
        self.conns: list[Conn] = []
        self.next = 0
        self.closing = False
        self.rid = 0
        self.drops: Counter[str] = Counter()
        self.drops_by_node: Counter[int] = Counter()
        self.drop_times: list[float] = []
        self.other: Counter[str] = Counter()  # frames nobody expected
        self.reset_traffic()
        Conn.owner = self

    def reset_traffic(self) -> None:
        self.ping_rtt, self.pings_sent, self.pongs = LogHist(), 0, 0
        self.ping_overdue = self.pong_late = 0
        self.ack_lat, self.dlv_lat = LogHist(), LogHist()
        self.sends: dict[int, tuple[float, str]] = {}  # rid -> (perf_counter, key)
        self.sent = self.acked = 0
        self.acked_keys: set[str] = set()
        self.delivered: set[str] = set()
        self.dup_deliveries = 0
        self.send_errors: Counter[str] = Counter()
        self.joins: dict[int, asyncio.Future[None]] = {}
        self.join_lat = LogHist()
        self.room_marker = ""
        self.room_sends: dict[int, float] = {}
        self.room_sent = self.room_acked = self.room_got = 0
        self.room_ack_lat, self.room_lat = LogHist(), LogHist()
        self.lag = LogHist()

    # -- connect -------------------------------------------------------------
    async def dial(self, g: int, hs: LogHist, errors: Counter[str]) -> Conn | None:
        a, node = self.args, g % len(self.urls)
        u = self.urls[node]
        host, port = u.hostname or "127.0.0.1", u.port or 80
        path = with_token(u.path or "/ws", issue_token(self.secret, f"{a.prefix}{g}", 7200))
        loop = asyncio.get_running_loop()
        async with self.slots:
            for attempt in range(a.tries):
                conn = Conn(host, port, path, g, node)
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                started = time.perf_counter()
                try:
                    sock.setblocking(False)
                    sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                    sock.bind((a.source_ip, 0))
                    async with asyncio.timeout(a.connect_timeout):
                        await loop.sock_connect(sock, (host, port))
                        await loop.create_connection(lambda c=conn: c, sock=sock)  # type: ignore[misc]
                        await conn.ready
                except (OSError, TimeoutError) as exc:
                    conn.abort()
                    sock.close()
                    errors[error_kind(exc)] += 1
                    if attempt < a.tries - 1:
                        errors["retried"] += 1
                        await asyncio.sleep(0.2 * (attempt + 1) * (1 + random.random()))
                    continue
                hs.add(time.perf_counter() - started)
                conn.held = True
                return conn
        return None

    async def open(self, count: int) -> dict[str, Any]:
        started, t0 = time.perf_counter(), time.time()
        first, self.next = self.next, self.next + count
        hs, errors = LogHist(), Counter[str]()
        got = await asyncio.gather(*(self.dial(self.args.first + i, hs, errors)
                                     for i in range(first, first + count)))
        new = [c for c in got if c is not None]
        self.conns += new
        seconds = time.perf_counter() - started
        return {"opened": len(new), "failed": count - len(new), "attempt_errors": dict(errors),
                "by_node": dict(Counter(c.node for c in new)), "open": self.open_count(),
                "seconds": round(seconds, 3), "started": t0, "ended": time.time(),
                "per_s": round(len(new) / seconds, 1) if seconds else None,
                "handshake": hs.report()}

    def open_count(self) -> int:
        return sum(not c.closed for c in self.conns)

    # -- frames --------------------------------------------------------------
    def dropped(self, conn: Conn, why: str) -> None:
        if conn.held and not self.closing:
            conn.held = False  # one drop per connection (a close frame, then the loss)
            self.drops[why] += 1
            self.drops_by_node[conn.node] += 1
            if len(self.drop_times) < 20:
                self.drop_times.append(time.time())

    def frame(self, conn: Conn, payload: bytes, now: float) -> None:
        f = orjson.loads(payload)
        op = f.get("op")
        if op == "pong":
            if f.get("re") == conn.ping_id:
                self.ping_rtt.add(now - conn.ping_at)
                self.pongs += 1
                conn.ping_id = 0
            else:
                self.pong_late += 1
        elif op == "ack":
            sent = self.sends.pop(f.get("re"), None)
            if sent is not None:
                self.ack_lat.add(time.perf_counter() - sent[0])
                self.acked += 1
                self.acked_keys.add(sent[1])
        elif op == "msg":
            body = f.get("body") or {}
            key = body.get("k")
            if key in self.delivered:
                self.dup_deliveries += 1
            elif key is not None:
                self.delivered.add(key)
                self.dlv_lat.add(now - body["t"])
        elif op == "room_msgs":
            for m in f.get("msgs", ()):
                body = m.get("body") or {}
                if body.get("m") == self.room_marker:
                    self.room_got += 1
                    self.room_lat.add(now - body["t"])
        elif op == "joined":
            fut = self.joins.pop(f.get("re"), None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        elif op == "ok" and f.get("re") in self.room_sends:
            self.room_ack_lat.add(time.perf_counter() - self.room_sends.pop(f["re"]))
            self.room_acked += 1
        elif op == "error":
            rid = f.get("re")
            code = f"{f.get('code')}"
            if self.sends.pop(rid, None) is not None:
                self.send_errors["send " + code] += 1
            elif self.room_sends.pop(rid, None) is not None:
                self.send_errors["room_send " + code] += 1
            elif (fut := self.joins.pop(rid, None)) is not None and not fut.done():
                fut.set_exception(ConnectionError(f"join refused: {code}"))
            else:
                self.other[f"error {code}"] += 1
        else:
            self.other[str(op)] += 1

    def next_id(self) -> int:
        self.rid += 1
        return self.rid

    # -- the hold ------------------------------------------------------------------
    async def pinger(self, every: float, until: float) -> None:
        """Each open connection pings once per ``every`` s: in a random order, evenly
        spaced (ping k goes to ``order[k % n]`` at ``k * every / n``), sent in 50 ms ticks."""
        order = random.sample(self.conns, len(self.conns))
        n = len(order)
        t0, done = time.monotonic(), 0
        while n and time.time() < until:
            due = int((time.monotonic() - t0 + TICK_S) * n / every)
            for k in range(done, due):  # pings a late tick missed are still sent
                c = order[k % n]
                if c.closed:
                    continue
                if c.ping_id:
                    self.ping_overdue += 1  # the previous one never ponged
                c.ping_id, c.ping_at = self.next_id(), time.time()
                c.send(b'{"op":"ping","id":%d}' % c.ping_id)
                self.pings_sent += 1
            done = max(done, due)
            await asyncio.sleep(TICK_S)

    def spread(self, n: int, offset: int = 0) -> list[int]:
        """Indices of ``n`` connections spread evenly over this process's, the k-th on
        node ``(k + first) % nodes`` (each node its share, whatever the stride)."""
        conns, nodes = self.conns, len(self.urls)
        if n <= 0 or len(conns) < 2:
            return []
        step, out = max(1, len(conns) // n), []
        for k in range(n):
            i = min(k * step + offset, len(conns) - 2)
            want = (k + self.args.first) % nodes
            i = next((j for j in range(i, min(i + nodes, len(conns) - 1))
                      if conns[j].node == want), i)
            out.append(i)
        return out

    def pairs(self, n: int) -> list[tuple[Conn, Conn]]:
        """``n`` sender -> receiver pairs: neighbours (so on different nodes)."""
        return [(self.conns[i], self.conns[i + 1]) for i in self.spread(n)]

    async def chat(self, pairs: list[tuple[Conn, Conn]], rate: float, until: float) -> None:
        """Open loop: ``rate`` sends a second, round robin over ``pairs``."""
        if not pairs or rate <= 0:
            return
        due, k, prefix = time.time() + random.random() / rate, 0, self.args.prefix
        while due < until:
            await asyncio.sleep(max(0.0, due - time.time()))
            sender, receiver = pairs[k % len(pairs)]
            k += 1
            due += 1 / rate
            if sender.closed:
                continue
            rid, key = self.next_id(), f"{prefix}{sender.g}.{k}"
            self.sends[rid] = (time.perf_counter(), key)
            sender.send(encode(make("send", rid, to=f"{prefix}{receiver.g}", cmid=f"c{k}",
                                    body={"t": time.time(), "k": key, "text": TEXT})))
            self.sent += 1

    async def join_room(self, members: list[Conn], room: str) -> int:
        gate = asyncio.Semaphore(self.args.concurrency)

        async def one(c: Conn) -> bool:
            async with gate:
                rid, fut = self.next_id(), asyncio.get_running_loop().create_future()
                self.joins[rid] = fut
                started = time.perf_counter()
                c.send(encode(make("join", rid, room=room)))
                try:
                    await asyncio.wait_for(fut, 30)
                except (ConnectionError, TimeoutError) as exc:
                    self.other[f"join failed: {exc}"[:80]] += 1
                    return False
                self.join_lat.add(time.perf_counter() - started)
                return True

        return sum(await asyncio.gather(*(one(c) for c in members)))

    async def room_pub(self, conn: Conn, room: str, rate: float, until: float) -> None:
        due = time.time()
        while due < until:
            await asyncio.sleep(max(0.0, due - time.time()))
            due += 1 / rate
            if conn.closed:
                continue
            rid = self.next_id()
            self.room_sends[rid] = time.perf_counter()
            conn.send(encode(make("room_send", rid, room=room, prio=0,
                                  body={"t": time.time(), "m": self.room_marker})))
            self.room_sent += 1

    async def watch_lag(self, until: float, period: float = 0.1) -> None:
        while time.time() < until:
            t = time.monotonic()
            await asyncio.sleep(period)
            self.lag.add(max(0.0, time.monotonic() - t - period))

    async def hold(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.reset_traffic()
        until, cpu0 = float(cmd["until"]), own_cpu()
        members = [self.conns[i] for i in dict.fromkeys(self.spread(cmd["room_members"], 2))]
        self.room_marker = cmd["marker"]
        joined = await self.join_room(members, cmd["room"]) if members else 0
        jobs = [self.pinger(cmd["ping_every"], until), self.watch_lag(until),
                self.chat(self.pairs(cmd["pairs"]), cmd["chat_rate"], until)]
        if cmd["room_rate"] > 0 and members:
            jobs.append(self.room_pub(members[0], cmd["room"], cmd["room_rate"], until))
        await asyncio.gather(*jobs)
        await asyncio.sleep(1.0)  # the others' last room message, pongs under way
        for _ in range(int(cmd["drain"] / 0.1)):  # bounded: what is still under way
            if not (self.sends or self.room_sends or self.acked_keys - self.delivered
                    or self.room_got < self.room_acked * joined
                    or any(c.ping_id for c in self.conns if not c.closed)):
                break
            await asyncio.sleep(0.1)
        return {"joined": joined, "room_members": len(members), "cpu_s": own_cpu() - cpu0,
                **self.traffic()}

    def traffic(self) -> dict[str, Any]:
        unanswered = sum(1 for c in self.conns if c.ping_id and not c.closed)
        return {
            "pings_sent": self.pings_sent, "pongs": self.pongs, "ping_overdue": self.ping_overdue,
            "pong_late": self.pong_late, "ping_unanswered": unanswered,
            "ping_rtt": self.ping_rtt.report(),
            "sent": self.sent, "acked": self.acked, "unanswered": len(self.sends),
            "send_errors": dict(self.send_errors), "ack_lat": self.ack_lat.report(),
            "delivered": len(self.delivered), "dup_deliveries": self.dup_deliveries,
            "lost": len(self.acked_keys - self.delivered), "dlv_lat": self.dlv_lat.report(),
            "join_lat": self.join_lat.report(),
            "room_sent": self.room_sent, "room_acked": self.room_acked,
            "room_unanswered": len(self.room_sends), "room_got": self.room_got,
            "room_ack_lat": self.room_ack_lat.report(), "room_lat": self.room_lat.report(),
            "loop_lag": self.lag.report(), "other": dict(self.other)}

    async def ping(self, sample: int) -> dict[str, Any]:
        """A WebSocket ping to ``sample`` open connections, spread evenly."""
        live = [c for c in self.conns if not c.closed]
        chosen = live[::max(1, len(live) // max(1, sample))][:sample]

        async def one(c: Conn) -> float | None:
            started = time.perf_counter()
            try:
                await asyncio.wait_for(c.ping(), 10)
            except Exception:  # noqa: BLE001 - a missing pong is the finding
                return None
            return time.perf_counter() - started

        times = sorted(t for t in await asyncio.gather(*(one(c) for c in chosen))
                       if t is not None)
        return {"sampled": len(chosen), "ponged": len(times),
                "p50_ms": round(times[len(times) // 2] * 1000, 2) if times else None,
                "max_ms": round(times[-1] * 1000, 2) if times else None}

    async def storm(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Every connection that dropped (its node died) dials again after a
        random delay within ``spread`` s (the SDKs' jittered backoff), then
        syncs over HTTP (``GET /v1/sync``, its user's token; 503 asked again
        after 0.5 s, up to 20 times): what a restarted node's users do."""
        spread, http = float(cmd.get("spread", 5.0)), str(cmd["http"])
        started, t0 = time.perf_counter(), time.time()
        hs, errors = LogHist(), Counter[str]()
        sync_lat = LogHist()
        synced = unavailable = sync_failed = 0
        done_at: list[float] = []
        connected_at: list[float] = []
        sync_errors: Counter[str] = Counter()
        sync_slots = asyncio.Semaphore(int(cmd.get("sync_concurrency", 100)))


        async def one(i: int, old: Conn, client: httpx.AsyncClient) -> None:
            nonlocal synced, unavailable, sync_failed
            await asyncio.sleep(random.random() * spread)
            conn = await self.dial(old.g, hs, errors)
            if conn is None:
                return
            self.conns[i] = conn
            reconnected = time.perf_counter()
            connected_at.append(reconnected - started)
            if not cmd.get("sync", True):
                done_at.append(reconnected - started)
                return
            token = issue_token(self.secret, f"{self.args.prefix}{old.g}", 7200)
            status = 0
            async with sync_slots:
                for _ in range(20):
                    try:
                        r = await client.get(f"{http}/v1/sync", params={"since": 0},
                                             headers={"Authorization": f"Bearer {token}"})
                    except httpx.HTTPError as exc:  # asked again, as a client would
                        sync_errors[type(exc).__name__] += 1
                        await asyncio.sleep(0.5)
                        continue
                    status = r.status_code
                    if status == 503:
                        unavailable += 1
                        await asyncio.sleep(0.5)
                        continue
                    break
            if status == 200:
                synced += 1
                sync_lat.add(time.perf_counter() - reconnected)
                done_at.append(time.perf_counter() - started)
            else:
                sync_failed += 1

        lost = [(i, c) for i, c in enumerate(self.conns) if c.closed]
        limits = httpx.Limits(max_connections=int(cmd.get("sync_concurrency", 100)))
        async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as client:
            await asyncio.gather(*(one(i, c, client) for i, c in lost))
        done_at.sort()
        connected_at.sort()
        return {"seconds_to_all_reconnected": round(connected_at[-1], 3) if connected_at
                else None, "sync_errors": dict(sync_errors), "lost": len(lost),
                "reconnected": sum(not self.conns[i].closed for i, _ in lost),
                "synced": synced, "sync_unavailable_answers": unavailable,
                "sync_failed": sync_failed, "attempt_errors": dict(errors), "started": t0,
                "seconds_to_all": round(done_at[-1], 3) if done_at else None,
                "seconds_to_half": round(done_at[len(done_at) // 2], 3) if done_at else None,
                "handshake": hs.report(), "sync": sync_lat.report()}

    def state(self) -> dict[str, Any]:
        live = [c for c in self.conns if not c.closed]
        return {"open": len(live), "held": len(self.conns),
                "open_by_node": dict(Counter(c.node for c in live)),
                "drops": dict(self.drops), "dropped": sum(self.drops.values()),
                "drops_by_node": dict(self.drops_by_node), "first_drop_times": self.drop_times,
                "rss": rss_bytes(), "cpu_s": own_cpu()}

    def close(self) -> int:
        if self.closing:
            return 0
        self.closing = True
        for c in self.conns:
            c.send(b"\x03\xe8", Opcode.CLOSE)
            c.abort()
        return len(self.conns)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def clients_main(args: argparse.Namespace) -> int:
    fd_limit = raise_fd_limit()
    clients = Clients(args, os.environ[SECRET_ENV])
    emit({"ready": True, "pid": os.getpid(), "fd_limit": fd_limit})
    try:
        async for line in stdin_lines():
            cmd: dict[str, Any] = orjson.loads(line)
            what = cmd.get("cmd")
            if what == "open":
                emit(await clients.open(int(cmd["count"])))
            elif what == "hold":
                emit(await clients.hold(cmd))
            elif what == "ping":
                emit(await clients.ping(int(cmd["sample"])))
            elif what == "storm":
                emit(await clients.storm(cmd))
            elif what == "state":
                emit(clients.state())
            elif what == "close":
                state = clients.state()
                emit({"closed": clients.close(), **state})
                await asyncio.sleep(0.5)  # let the close frames and FINs go out
                return 0
            else:
                emit({"error": f"unknown command {line[:80]!r}"})
    finally:
        clients.close()  # EOF, an error: nothing stays open
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.many_clients",
                                description="many client connections, driven from stdin")
    p.add_argument("--urls", required=True, help="the nodes, comma-separated")
    p.add_argument("--source-ip", required=True, help="loopback address to connect from")
    p.add_argument("--prefix", required=True, help="user ids are PREFIX<global index>")
    p.add_argument("--first", type=int, default=0, help="global index of the first connection")
    p.add_argument("--concurrency", type=int, default=200, help="handshakes at once")
    p.add_argument("--tries", type=int, default=4, help="attempts per connection")
    p.add_argument("--connect-timeout", type=float, default=30.0, help="seconds per attempt")
    p.add_argument("--max-seconds", type=float, default=1800.0, help="exit after this long")
    args = p.parse_args(argv)
    check_loopback(p, args.urls.split(","))
    if not args.source_ip.startswith("127."):
        p.error("--source-ip must be a loopback address (127.0.0.x)")

    async def bounded() -> int:
        try:
            return await asyncio.wait_for(clients_main(args), args.max_seconds)
        except TimeoutError:
            return 2

    return int(run_loop(bounded()))


if __name__ == "__main__":
    sys.exit(main())
