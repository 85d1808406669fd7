"""Locust scenario: live-room members on the gateway's WebSocket.

    locust -f loadtest/rooms.py --headless -u 200 -r 50 -t 60s \\
        --host ws://127.0.0.1:8080 --csv bench/out/locust-rooms

Each simulated member opens one WebSocket (``/ws?token=JWT``), joins one of
``--rooms`` rooms (member i joins room i mod rooms) and reads every frame in
a greenlet of its own. A ``--publishers`` fraction of the members also sends
one ``room_send`` every ``--send-interval`` seconds, its body carrying the
send time (``time.time()`` in ms), this process's run tag and the sender's
serial. Each member ticks at a random phase of its own.

Reported to locust as requests (request type ``room`` unless noted):

- ``ws`` / ``connect``: TCP + WebSocket handshake (``ws`` / ``reconnect`` for
  each attempt after a connection was lost, a blip or the node said ``reconnect``).
- ``join``: join sent -> ``joined`` received.
- ``send``: room_send sent -> ``ok`` received. A ``rate_limited`` error is a
  failure named ``send rate_limited``; other errors fail ``send`` with the code.
  Requests with no reply within ``--reply-timeout`` s fail as ``<op> timeout``.
- ``fanout``: one per room message received in a ``room_msgs`` frame whose
  body carries a send time ``t`` (so also those of other locust worker
  processes), response time = receive time - ``t`` (same machine clock),
  response length = that message's share of its ``room_msgs`` frame. It
  includes the node's coalescing window (``IM_ROOM_WINDOW_MS``, 25 ms) by
  design; messages sampled out by the delivery cap (``IM_ROOM_RATE_CAP``) never
  arrive and are not counted. A message whose ``pos`` this member has seen
  already (live, or in a ``joined`` reply) is not counted again.
- ``reconnect``: a server ``reconnect`` frame, a lost connection or the end of
  a blip, time to be connected and joined again (a lost connection itself fails
  ``disconnected``; a blip does not).
- ``recover``: after a reconnect, the rejoin carrying ``since`` = {epoch, the
  highest ``pos`` received} sent -> ``joined`` received; response length = the
  messages recovered (those of the ``joined`` reply when ``recovered`` is true,
  else 0). Sent only with an epoch and a pos known: with history off on the
  node (``IM_ROOM_HISTORY=0``, no ``epoch`` / ``pos``) the rejoin is a ``join``.
  An error reply fails ``recover`` with its code; the member then joins plainly.
- ``recovered true`` / ``recovered false``: the outcome of each ``recover``
  (same response time and length); the count of each is its request count.
  ``recovered: false`` (a new epoch, or messages after ``pos`` no longer kept,
  or no ``recovered`` field) is not a failure.
- ``blip``: with ``--blip-every S``, each member on average every S s
  (exponential gaps) closes its socket abruptly (no close frame), stays away
  ``--blip-for`` s and reconnects, recovering as above; response time = time
  away. A blip due while not joined is skipped.

Each member tracks its room's ``epoch`` and the highest ``pos`` received (from
``room_msgs`` and ``joined``; the ``joined`` reply's ``pos`` counts as received)
and dedups messages by ``pos`` (a window of the last few thousand positions);
a new epoch resets both.

The protocol is the Python SDK's sans-I/O core (``imgate_client.core``, the
gevent / websocket-client transport is this file's): frames and request ids,
the room's positions and the rejoin-with-``since`` recipe (``RoomState`` with
``keep_late``: a late message is still counted once), and when and where to
reconnect (``ReconnectPolicy``: a lost connection waits the SDK's jittered
backoff, 0.1 s doubling to 5 s, before the next node; a ``reconnect`` frame or
close 1001 moves on after up to 0.5 s; close 4003 or a 403 handshake stops the
member, counted as ``stopped``; close 4001 reconnects at once with a new token).

The token is signed with ``--secret`` (env ``IM_AUTH_SECRET``, else the
local secret a node on this machine made: ``IM_AUTH_SECRET_FILE``). User ids
are unique per run and process (``lt<run tag>-<n>``), so ``--processes N``
works too.
``--nodes ws://a,ws://b`` spreads members over several nodes (round robin;
reconnects go to the next one); without it every member uses ``--host``.
"""

# isort: off
from locust import User, events, task  # first: gevent's monkeypatching
# isort: on

import itertools
import os
import random
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import gevent
import websocket
from gevent.event import Event
from imgate_client.core import (
    Action,
    Backoff,
    Decision,
    ReconnectPolicy,
    RequestIds,
    RoomState,
    decode,
    encode,
    error_of,
    make,
    with_token,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # locust adds only loadtest/
from gateway.auth import with_secret  # noqa: E402
from gateway.config import Settings  # noqa: E402
from testkit.tokens import issue_token  # noqa: E402


def _local_secret() -> str:
    """The secret a node on this machine signs with when IM_AUTH_SECRET is unset."""
    return with_secret(Settings.from_env())[0].auth_secret


RUN = secrets.token_hex(3)  # user ids and message bodies carry it
_serial = itertools.count()
_SEEN_MAX = 4096  # positions kept for dedup; then the oldest half is forgotten


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    g = parser  # LocustArgumentParser: include_in_web_ui works only on it, not on a group
    g.add_argument("--rooms", type=int, default=3, env_var="LT_ROOMS",
                   help="rooms the members spread over (default 3)")
    g.add_argument("--room-prefix", default="lt", env_var="LT_ROOM_PREFIX",
                   help="room ids are PREFIX-0 .. PREFIX-(rooms-1) (default lt)")
    g.add_argument("--publishers", type=float, default=0.1, env_var="LT_PUBLISHERS",
                   help="fraction of members that also send (default 0.1)")
    g.add_argument("--send-interval", type=float, default=1.0, env_var="LT_SEND_INTERVAL",
                   help="seconds between one publisher's sends (default 1)")
    g.add_argument("--prio", type=int, default=0, choices=(0, 1), env_var="LT_PRIO",
                   help="prio of the room sends (default 0)")
    g.add_argument("--reply-timeout", type=float, default=10.0, env_var="LT_REPLY_TIMEOUT",
                   help="seconds to wait for joined / ok before failing (default 10)")
    g.add_argument("--blip-every", type=float, default=0.0, env_var="LT_BLIP_EVERY",
                   help="mean seconds between one member's network blips (default 0: off)")
    g.add_argument("--blip-for", type=float, default=2.0, env_var="LT_BLIP_FOR",
                   help="seconds a member stays away on a blip (default 2)")
    g.add_argument("--nodes", default="", env_var="LT_NODES",
                   help="comma-separated ws:// URLs of several nodes (default: --host)")
    g.add_argument("--secret", default=os.environ.get("IM_AUTH_SECRET") or _local_secret(),
                   include_in_web_ui=False, help="token secret (env IM_AUTH_SECRET)")


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    csv = getattr(environment.parsed_options, "csv_prefix", None)
    if csv and os.path.dirname(csv):
        os.makedirs(os.path.dirname(csv), exist_ok=True)


class ServerError(Exception):
    """An ``error`` reply: its code and message."""


class RoomMember(User):
    """One room member: a WebSocket, a reader greenlet, and (maybe) a publisher."""

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        o = environment.parsed_options
        self.opts = o
        self.serial = next(_serial)
        self.user_id = f"lt{RUN}-{self.serial}"
        self.room = f"{o.room_prefix}-{self.serial % max(1, o.rooms)}"
        # Exactly the fraction asked for, spread evenly over the serials.
        self.publisher = int((self.serial + 1) * o.publishers) > int(self.serial * o.publishers)
        nodes = [u.strip() for u in o.nodes.split(",") if u.strip()] or [self.host or ""]
        self.nodes = [_ws_url(u) for u in nodes]
        self.node_index = self.serial % len(self.nodes)
        self.ws: websocket.WebSocket | None = None
        self.reader: gevent.Greenlet | None = None
        self.blipper: gevent.Greenlet | None = None
        self.joined = Event()
        self.pending: dict[str, tuple[str, float]] = {}
        self.ids = RequestIds("q")
        self.reconnect_started: float | None = None  # perf_counter when connection was lost
        self.next_tick: float | None = None  # time.monotonic() of the next tick
        self.blip_until: float | None = None  # time.monotonic() a blip ends, while in one
        self.stopping = False
        self.stopped = False  # the node said stop (4003, 403): no more reconnects
        # The room's history as this member saw it: epoch, highest pos, pos seen (the SDK's).
        self.room_state = self._fresh_room()
        self.policy = ReconnectPolicy(Backoff(base=0.2, cap=5.0))
        self.refused: Decision | None = None  # the last failed connect's decision

    # -- lifecycle -------------------------------------------------------------
    def on_start(self) -> None:
        self._connect_and_join("connect")  # on failure the reader retries
        self.reader = gevent.spawn(self._read_loop)
        if self.opts.blip_every > 0:
            self.blipper = gevent.spawn(self._blip_loop)

    def on_stop(self) -> None:
        self.stopping = True
        for g in (self.reader, self.blipper):
            if g is not None:
                g.kill(block=False)
        self._close()

    def wait_time(self) -> float:
        """Until this member's next tick: one every --send-interval s, at a random phase
        of its own (users spawned in one batch would otherwise send in step)."""
        interval = self.opts.send_interval
        now = time.monotonic()
        if self.next_tick is None:
            self.next_tick = now + random.uniform(0, interval)
        else:
            self.next_tick = max(self.next_tick + interval, now)
        return self.next_tick - now

    @task
    def tick(self) -> None:
        """Every --send-interval s: fail overdue requests; publishers send."""
        self._expire()
        if self.publisher and self.joined.is_set() and self.ws is not None:
            body = {"t": time.time() * 1000, "r": RUN, "u": self.serial}
            self._request("send", "room_send", room=self.room, body=body, prio=self.opts.prio)

    # -- connection --------------------------------------------------------------
    def _fresh_room(self) -> RoomState:
        return RoomState(self.room, keep_late=True, window=_SEEN_MAX)

    def _send_join(self) -> None:
        """join, or ``recover`` (``since``) once this member has an epoch; frames
        that come before the reply are counted as they come (``hold=False``)."""
        fields = self.room_state.join_fields(rejoin_history=0, hold=False)
        self._request("recover" if "since" in fields else "join", "join", **fields)

    def _connect_and_join(self, name: str) -> Decision | None:
        """Open a WebSocket and send join (``recover``, with ``since``, when this
        member has an epoch and a pos); fires ``ws/<name>`` for the handshake.
        None when connected, else what the SDK's policy says to do."""
        url = self.nodes[self.node_index % len(self.nodes)]
        started = time.perf_counter()
        try:
            ws = websocket.create_connection(
                with_token(url, issue_token(self.opts.secret, self.user_id)), timeout=10,
                skip_utf8_validation=True)
        except Exception as exc:  # noqa: BLE001 - reported to locust
            _fire("ws", name, started, 0, exc)
            status = getattr(exc, "status_code", None)
            self.refused = self.policy.on_refused(status if isinstance(status, int) else None)
            return self.refused
        ws.settimeout(None)
        _fire("ws", name, started, 0)
        self.policy.on_open(time.monotonic())
        self.ws = ws
        self.joined.clear()
        self._send_join()
        return None

    def _close(self, abrupt: bool = False) -> None:
        ws, self.ws = self.ws, None
        self.joined.clear()
        if ws is not None:
            try:
                if abrupt:
                    raise ConnectionError("no close frame")
                ws.close(timeout=1)
            except Exception:  # noqa: BLE001 - closing anyway
                ws.shutdown()

    def _reconnect(self, decision: Decision | None = None) -> None:
        """Back to a node, as the SDK's policy says (``decision``: how the connection
        ended; None: at once, to the next node), backing off until connected or
        stopped. ``reconnect`` is reported when the ``joined`` reply arrives."""
        self._close()
        self.pending.clear()
        if self.reconnect_started is None:
            self.reconnect_started = time.perf_counter()
        while not self.stopping:
            if decision is not None:
                if decision.action is Action.STOP:
                    self._stop(decision.reason)
                    return
                if decision.action is not Action.REFRESH:  # a new token is issued anyway
                    self.node_index += 1
                gevent.sleep(decision.delay)
            else:
                self.node_index += 1
            decision = self._connect_and_join("reconnect")
            if decision is None:
                return

    def _stop(self, reason: str) -> None:
        self.stopped = True
        _fire("room", "stopped", time.perf_counter(), 0, ConnectionError(reason))

    def _blip_loop(self) -> None:
        """Every --blip-every s on average (exponential gaps): cut this member's
        socket without a close frame; the reader stays away --blip-for s, then
        reconnects and recovers. Skipped while not joined (e.g. reconnecting)."""
        rate = 1.0 / self.opts.blip_every
        while not self.stopping:
            gevent.sleep(random.expovariate(rate))
            ws = self.ws
            if self.stopping or ws is None or ws.sock is None or not self.joined.is_set():
                continue
            self.blip_until = time.monotonic() + max(0.0, self.opts.blip_for)
            self.joined.clear()  # no sends meanwhile
            try:
                ws.sock.shutdown(socket.SHUT_RDWR)  # the reader's recv fails now
            except OSError:
                pass  # already gone: the reader sees that too

    def _blip_back(self) -> None:
        """In the reader, after a blip cut the socket: stay away, then report ``blip``."""
        started = time.perf_counter()
        self._close(abrupt=True)
        gevent.sleep(max(0.0, (self.blip_until or 0.0) - time.monotonic()))
        self.blip_until = None
        _fire("room", "blip", started, 0)

    # -- requests and replies ----------------------------------------------------
    def _request(self, kind: str, op: str, **fields: Any) -> None:
        rid = self.ids.next()
        self.pending[rid] = (kind, time.perf_counter())
        ws = self.ws
        try:
            if ws is None:
                raise ConnectionError("not connected")
            ws.send(encode(make(op, rid, **fields)).decode())
        except Exception as exc:  # noqa: BLE001 - reported; the reader reconnects
            self.pending.pop(rid, None)
            _fire("room", kind, time.perf_counter(), 0, exc)

    def _expire(self) -> None:
        now = time.perf_counter()
        limit = self.opts.reply_timeout
        for rid, (kind, started) in list(self.pending.items()):
            if now - started > limit:
                del self.pending[rid]
                _fire("room", f"{kind} timeout", started, 0,
                      TimeoutError(f"no reply in {limit:g} s"))

    def _read_loop(self) -> None:
        while not self.stopping and not self.stopped:
            ws = self.ws
            if ws is None:  # the first connect failed
                self._reconnect(self.refused or self.policy.on_refused(None))
                continue
            try:
                opcode, raw = ws.recv_data(control_frame=True)
            except Exception as exc:  # noqa: BLE001 - connection lost
                if self.stopping:
                    return
                if self.blip_until is not None:  # our own blip: not a failure
                    self._blip_back()
                    self._reconnect()
                    continue
                _fire("room", "disconnected", time.perf_counter(), 0, exc)
                self._reconnect(self.policy.on_close(None, time.monotonic()))
                continue
            if opcode == websocket.ABNF.OPCODE_CLOSE:  # answered by websocket-client
                code = int.from_bytes(raw[:2], "big") if len(raw) >= 2 else None
                if self.stopping:
                    return
                _fire("room", "disconnected", time.perf_counter(), 0,
                      ConnectionError(f"closed by the node: {code}"))
                self._reconnect(self.policy.on_close(code, time.monotonic()))
                continue
            if opcode not in (websocket.ABNF.OPCODE_TEXT, websocket.ABNF.OPCODE_BINARY) \
                    or not raw:
                continue  # ping (answered), pong, an empty frame
            try:
                self._on_frame(raw)
            except Exception as exc:  # noqa: BLE001 - a frame we cannot read
                _fire("room", "bad frame", time.perf_counter(), len(raw), exc)

    def _on_frame(self, raw: str | bytes) -> None:
        received_ms = time.time() * 1000
        f = decode(raw)
        op = f.get("op")
        if op == "room_msgs":
            share = len(raw) // max(1, len(f.get("msgs") or ()))
            for m in self.room_state.on_frame(f):  # each position once
                body = m.get("body")
                sent = body.get("t") if isinstance(body, dict) else None
                if isinstance(sent, (int, float)):
                    events.request.fire(request_type="room", name="fanout",
                                        response_time=max(0.0, received_ms - sent),
                                        response_length=share, exception=None, context={})
            return
        if op == "reconnect":
            self._reconnect(self.policy.on_close(None, time.monotonic(), told_to_move=True))
            return
        entry = self.pending.pop(str(f.get("re")), None) if "re" in f else None
        if entry is None:
            return
        kind, started = entry
        err = error_of(f)
        if err is not None:
            code, message = err
            name = "send rate_limited" if code == "rate_limited" else kind
            _fire("room", name, started, len(raw), ServerError(f"{code}: {message}"))
            if kind == "recover":  # once, as a plain join: this history is of no use
                self.room_state = self._fresh_room()
                self._send_join()
        elif op == "joined":
            self._on_joined(f, kind, started, len(raw))
        else:
            _fire("room", kind, started, len(raw))

    def _on_joined(self, f: dict[str, Any], kind: str, started: float, length: int) -> None:
        if f.get("epoch") is None:
            self.room_state = self._fresh_room()  # history off here: nothing to recover from
        joined = self.room_state.on_joined(f, since_sent=kind == "recover")
        if kind == "recover":
            recovered = joined.recovered is True
            n = len(f.get("msgs") or ()) if recovered else 0
            _fire("room", "recover", started, n)
            _fire("room", f"recovered {'true' if recovered else 'false'}", started, n)
        else:
            _fire("room", kind, started, length)
        self.joined.set()
        if self.reconnect_started is not None:
            _fire("room", "reconnect", self.reconnect_started, 0)
            self.reconnect_started = None


def _fire(kind: str, name: str, started: float, length: int,
          exc: BaseException | None = None) -> None:
    events.request.fire(request_type=kind, name=name,
                        response_time=(time.perf_counter() - started) * 1000,
                        response_length=length, exception=exc, context={})


def _ws_url(base: str) -> str:
    """``ws://host:port`` (or ``.../ws``) -> the ``/ws`` endpoint."""
    u = urlsplit(base.rstrip("/"))
    if u.scheme not in ("ws", "wss"):
        raise ValueError(f"{base!r}: --host / --nodes must be ws:// or wss:// URLs")
    return base.rstrip("/") if u.path.endswith("/ws") else base.rstrip("/") + "/ws"
