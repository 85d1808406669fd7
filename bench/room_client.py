"""The room client of ``bench.room_bench``: many subscriber sockets in one process,
for our node and both baselines; and the publisher the benchmark drives.

Sockets are ``testkit.lean``'s (no task per socket, framing by hand, nothing
compressed), speaking our protocol (frames built and read by the Python SDK's
sans-I/O core, ``imgate_client.core``) or Socket.IO's on top. Not the SDK's
``Client``: a task, an outbox and a dedup window per socket would cost this
process more CPU than the node it measures (thousands of subscribers on 2
cores), and a subscriber only counts markers in the raw bytes. Each body carries
the phase's marker (``"m": "~<hex>~"``): a frame's messages of the phase are
counted exactly by ``payload.count(marker)``; 1 in ``--sample-every`` sockets
also parse frames for latency (receive ``time.time()`` - the publisher's, from
the body) into a log histogram (``bench.stats.LogHist``).

Started by the benchmark (token secret in ``ROOM_BENCH_SECRET``); prints a JSON line
once all its sockets joined, then answers JSON lines on stdin (``phase``, ``stats``,
``quit``); exits on ``quit``, EOF on stdin or after ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import orjson
from imgate_client.core import decode, encode, error_of, make, with_token
from websockets.frames import Opcode

from bench.cli import check_loopback
from bench.common import emit, raise_fd_limit, run_loop, stdin_lines
from bench.stats import LogHist
from testkit.lean import LeanSocket, open_lean
from testkit.tokens import issue_token

KINDS = ("ours", "ws", "sio")
ROOM = "r1"
PAD = "x" * 40


def conn_path(kind: str, url: str, user: str, secret: str) -> str:
    """The request target of a subscriber or publisher socket on server ``kind``."""
    base = urlsplit(url).path or "/"
    if kind == "ours":
        return with_token(base, issue_token(secret, user, 7200))
    if kind == "ws":
        return f"{base}?user={user}"
    return "/socket.io/?EIO=4&transport=websocket"


class Stats:
    """Counts of the current phase in one process (all its sockets)."""

    def __init__(self, n_urls: int) -> None:
        self.n_urls = n_urls
        self.reset("~none~", 0.0, 0.0)
        self.other: Counter[str] = Counter()

    def reset(self, marker: str, open_t: float, close_t: float) -> None:
        self.marker_s, self.marker = marker, marker.encode()
        self.open_t, self.close_t = open_t, close_t
        self.total = self.win = self.frames_win = 0
        self.url_win = [0] * self.n_urls
        self.lat = LogHist()

    def report(self) -> dict[str, Any]:
        return {"total": self.total, "win": self.win, "frames_win": self.frames_win,
                "url_win": self.url_win, "hist": self.lat.buckets, "lat_max": self.lat.max,
                "other": dict(self.other)}


class Conn(LeanSocket):
    """One client WebSocket (``testkit.lean``) in a room: joins on open (``ready``
    = the ``joined`` reply) and counts the phase's messages; subclasses speak
    another server's protocol."""

    def __init__(self, host: str, port: int, path: str, stats: Stats, url_idx: int = 0,
                 sampled: bool = False) -> None:
        super().__init__(host, port, path)
        self.stats, self.url_idx, self.sampled = stats, url_idx, sampled
        self.got = 0  # messages of the phase on this socket
        self.on_text = self.count_frame  # type: ignore[method-assign]

    def on_lost(self, exc: Exception | None) -> None:
        self.stats.other["socket closed"] += 1

    def on_close_frame(self, payload: bytes) -> None:
        self.stats.other[f"close frame {payload[:2].hex()} {payload[2:60]!r}"] += 1

    # -- counting ---------------------------------------------------------------
    def count_frame(self, payload: bytes, now: float) -> None:
        """A subscriber's frame: count the phase's messages in it, or handle control."""
        st = self.stats
        n = payload.count(st.marker)
        if not n:
            self.control(payload)
            return
        self.got += n
        st.total += n
        if st.open_t <= now < st.close_t:
            st.win += n
            st.frames_win += 1
            st.url_win[self.url_idx] += n
            if self.sampled:
                for body in self.bodies(payload):
                    if body.get("m") == st.marker_s:
                        st.lat.add(now - body["t"])

    # -- protocol (ours; the ws baseline speaks the same subset) -----------------
    def on_open(self) -> None:
        self.send(encode(make("join", 1, room=ROOM)))

    def control(self, payload: bytes) -> None:
        f = decode(payload)
        op, err = f.get("op"), error_of(f)
        if op == "joined" and f.get("re") == 1:
            self.set_ready(f)
        elif err is not None and f.get("re") == 1:
            self.fail(ConnectionError(f"join refused: {f}"))
        elif (op == "ok" or err is not None) and f.get("re") is not None:
            self.ack(f)
        elif op != "room_msgs":  # room_msgs of another phase: late, not counted
            self.stats.other[f"{op}:{f.get('code', '')}"] += 1

    def ack(self, f: dict[str, Any]) -> None:
        """Replies to the publisher's sends; see ``Publisher``."""

    def bodies(self, payload: bytes) -> list[dict[str, Any]]:
        return [m["body"] for m in decode(payload)["msgs"]]

    def room_send(self, rid: int, body: dict[str, Any]) -> None:
        self.send(encode(make("room_send", rid, room=ROOM, body=body, prio=0)))


class SioConn(Conn):
    """Engine.IO v4 / Socket.IO v5 over the websocket transport, by hand."""

    def on_open(self) -> None:
        pass  # the server speaks first: "0{...}"

    def control(self, payload: bytes) -> None:
        if payload == b"2":  # Engine.IO ping
            self.send(b"3")
        elif payload[:1] == b"0":  # Engine.IO open
            self.send(b"40")
        elif payload[:2] == b"40":  # Socket.IO connected: join with ack id 1
            self.send(b'421["join","' + ROOM.encode() + b'"]')
        elif payload[:2] == b"43":  # ack: 43<id>[...]
            rid_end = payload.index(b"[")
            rid = int(payload[2:rid_end])
            if rid == 1:
                self.set_ready({"op": "joined", "ack": payload[rid_end:].decode()})
            else:
                self.ack({"op": "ok", "re": rid})
        elif payload[:4] == b'42["':  # an event of another phase: late, not counted
            if not payload.startswith(b'42["m"'):
                self.stats.other[payload[:40].decode(errors="replace")] += 1
        else:
            self.stats.other[payload[:40].decode(errors="replace")] += 1

    def bodies(self, payload: bytes) -> list[dict[str, Any]]:
        return [orjson.loads(payload[2:])[1]["body"]]

    def room_send(self, rid: int, body: dict[str, Any]) -> None:
        self.send(b"42%d" % rid + orjson.dumps(["room_send", {"room": ROOM, "body": body}]))


async def open_conn(kind: str, url: str, path: str, stats: Stats, url_idx: int = 0,
                    sampled: bool = False, timeout: float = 30) -> Conn:
    """Connect, upgrade and join the room."""
    u = urlsplit(url)
    cls = SioConn if kind == "sio" else Conn

    def retried() -> None:
        stats.other["connect retried"] += 1

    sock = await open_lean(lambda: cls(u.hostname or "127.0.0.1", u.port or 80, path, stats,
                                       url_idx, sampled), timeout, on_retry=retried)
    assert isinstance(sock, Conn)
    return sock


# -- the publisher (used by bench.room_bench, in its own process) -----------------------
class Publisher:
    """One publishing socket: numbered room sends, acks matched by id (our ``ok``; the
    ws baseline answers the same; socket.io answers with an ack packet ``43<id>``)."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        conn.ack = self._on_reply  # type: ignore[method-assign]
        conn.on_text = self._on_text  # type: ignore[method-assign]
        self.rid = 1
        self.inflight: dict[int, bool] = {}  # id -> sent in the measured window
        self.sent_at: dict[int, float] = {}  # id -> perf_counter() at the send
        self.ack_lat: list[float] = []  # s, send to ``ok``, sends of the measured window
        self.errors: Counter[str] = Counter()
        self.window_open = False
        self.slots: asyncio.Semaphore | None = None
        self.begin("~none~")

    def begin(self, marker: str) -> None:
        self.marker = marker
        self.conn.stats.reset(marker, 0.0, 0.0)
        self.sent = self.acked = self.sent_win = self.echo = 0
        self.errors.clear()
        self.ack_lat.clear()

    def _on_text(self, payload: bytes, now: float) -> None:
        n = payload.count(self.conn.stats.marker)  # the publisher is in the room too
        self.echo += n
        if not n:
            self.conn.control(payload)

    def _on_reply(self, f: dict[str, Any]) -> None:
        win = self.inflight.pop(f.get("re"), None)  # type: ignore[arg-type]
        if win is None:
            return
        at = self.sent_at.pop(f["re"])
        if win and f.get("op") == "ok":
            self.ack_lat.append(time.perf_counter() - at)
        if self.slots is not None:
            self.slots.release()
        if f.get("op") == "ok":
            self.acked += 1
        else:
            self.errors[str(f.get("code"))] += 1

    def publish(self) -> None:
        self.rid += 1
        self.inflight[self.rid] = self.window_open
        self.sent_at[self.rid] = time.perf_counter()
        # ~100 bytes of JSON: t, m, s and padding
        self.conn.room_send(self.rid, {"t": time.time(), "m": self.marker, "s": self.rid,
                                       "x": PAD})
        self.sent += 1
        self.sent_win += self.window_open

    async def closed_loop(self, window: int, until: float) -> None:
        """Keep ``window`` sends un-acked until ``until`` (time.time())."""
        self.slots = asyncio.Semaphore(window)
        while time.time() < until and not self.conn.closed:
            await self.slots.acquire()  # the caller cancels this if acks stop coming
            self.publish()

    async def paced(self, rate: float, until: float) -> list[float]:
        """Open loop: ``rate`` sends a second whatever the acks do; returns send lags."""
        due, lags = time.time(), []
        while due < until and not self.conn.closed:
            delay = due - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            lags.append(max(0.0, time.time() - due))
            self.publish()
            due += 1 / rate
        return lags


# -- the subscriber process ---------------------------------------------------------------
async def serve(args: argparse.Namespace) -> None:
    raise_fd_limit()
    urls, secret = args.urls.split(","), os.environ.get("ROOM_BENCH_SECRET", "")
    stats, gate, t0 = Stats(len(urls)), asyncio.Semaphore(args.concurrency), time.perf_counter()

    async def one(g: int) -> Conn:  # g: global subscriber index (node, sampling, user id)
        url = urls[g % len(urls)]
        async with gate:
            return await open_conn(args.kind, url,
                                   conn_path(args.kind, url, f"{args.tag}-s{g}", secret),
                                   stats, g % len(urls), g % args.sample_every == 0)

    try:
        conns = await asyncio.gather(*(one(args.first + i) for i in range(args.count)))
    except Exception as exc:  # noqa: BLE001 - reported to the benchmark, which stops
        emit({"ev": "failed", "error": repr(exc)[:500], "other": dict(stats.other)})
        return
    emit({"ev": "ready", "joined": len(conns), "seconds": round(time.perf_counter() - t0, 2),
          "sampled": sum(c.sampled for c in conns), "pid": os.getpid()})
    try:
        async for line in stdin_lines():
            cmd = orjson.loads(line)
            if cmd["cmd"] == "phase":
                stats.reset(cmd["marker"], cmd["open"], cmd["close"])
                for c in conns:
                    c.got = 0
                emit({"ev": "ok"})
            elif cmd["cmd"] == "stats":
                gots = sorted(c.got for c in conns)
                emit({"ev": "stats", **stats.report(), "got_min": gots[0], "got_max": gots[-1],
                      "short": sum(g < gots[-1] for g in gots),
                      "closed": sum(c.closed for c in conns)})
            elif cmd["cmd"] == "quit":
                break
    finally:
        for c in conns:
            c.send(b"\x03\xe8", Opcode.CLOSE)
            c.abort()
        await asyncio.sleep(0.1)


def parse_args(module: str, doc: str | None, kinds: tuple[str, ...],
               *extra: tuple[str, int]) -> argparse.Namespace:
    """The subscriber process's flags (shared with its C twin, ``bench.room_client_c``)."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=kinds, required=True)
    p.add_argument("--urls", required=True, help="comma-separated; socket i goes to i %% n")
    for flag, default in (("--first", 0), ("--count", 100), ("--sample-every", 10),
                          ("--concurrency", 64), ("--max-seconds", 3600), *extra):
        p.add_argument(flag, type=int, default=default)
    p.add_argument("--tag", default="rb")
    args = p.parse_args()
    check_loopback(p, args.urls.split(","))
    if min(args.count, args.sample_every, args.concurrency) < 1:
        p.error("--count, --sample-every and --concurrency must be >= 1")
    return args


def main() -> None:
    args = parse_args("bench.room_client", __doc__, KINDS)

    with contextlib.suppress(KeyboardInterrupt, TimeoutError):
        run_loop(asyncio.wait_for(serve(args), args.max_seconds))


if __name__ == "__main__":
    main()
