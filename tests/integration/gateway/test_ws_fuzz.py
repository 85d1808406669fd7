"""Hypothesis fuzz of WebSocket frames against a real in-process node.

Design: one in-process node (``make_node`` with the documented default limits;
real Redis, RabbitMQ, MongoDB) serves the whole run on pytest-asyncio's loop.
Hypothesis only generates (``Phase.generate``, a fixed seed): the examples are
collected first, then each runs on the test's loop in order (a failure names its
frames), so no second loop, thread or subprocess is needed, and the checks after
the last example (``/healthz``, a fresh round trip, no error logged by the node)
sit in the same test. An example is a list of frames sent on a fresh connection
of a fresh user (``uid``), so a connection the node closed costs the next example
nothing: (1) protocol ops with hostile field values (ints at and past 2**53, 2**63
and 2**64, NaN/Infinity tokens, lone surrogates escaped in the JSON text, NUL in
keys and strings, bad ids, strings up to past the frame limit, nesting past
orjson's limits, wrong types, missing and extra fields), (2) arbitrary JSON, (3)
mangled, random text and binary frames. Fixed seed (``derandomize``), bounded
``max_examples``, no example database.

Invariants per example: every text frame that is a JSON object with a usable
``id`` gets a frame with ``re`` = that id (a successful ``recv_ack`` has no
reply), unless the node closed for a documented reason (1008 after
``IM_BAD_FRAME_LIMIT`` refused frames, 1009 after a frame over ``IM_MAX_FRAME``);
never a 1011 or any other close; every error has a contract code (not
``internal``) and a message without traceback or driver text; every frame from
the node is a JSON object with ``op``. Afterwards another user's fresh
connection gets a ``pong`` and an ``ack``, and the body of an acked ``send`` reads
back byte for byte from ``GET /v1/sync``.

A product bug the fuzz found (a 1011 close) is pinned by the test at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from testkit.device import Device
from testkit.http import HttpUser
from tests.conftest import token, uid

# The contract's error codes (shared protocol.md, "Error codes").
CODES = frozenset({"bad_request", "unauthorized", "forbidden", "not_found", "too_large",
                   "rate_limited", "unavailable", "internal"})
# Limits the node is started with: the documented defaults, stated here because
# the strategies aim at their edges and the close checks depend on them.
MAX_BODY = 4096
MAX_FRAME = 65_536
BAD_FRAME_LIMIT = 20
MAX_MID = 2**53 - 1
MAX_EXAMPLES = 300
# Bounded waits, never sleeps: a reply to a frame may wait on a MongoDB journal
# write or a broker confirm; 10 s is far beyond that on a healthy node and is
# only ever spent when the node stops answering (the failure being looked for).
REPLY_WAIT_S = 10
EXAMPLE_BOUND_S = 60  # one example, whatever happens in it
CLOSE_POLL_S = 0.05  # see next_frame
LEAK_MARKERS = ("Traceback", "Error(", "pymongo", "redis", "Redis", "Mongo", "bson",
                'File "', "Exception")


# -- frames -------------------------------------------------------------------
class _Me:
    """Where the example's own user id goes (known only when the example runs)."""

    def __repr__(self) -> str:
        return "ME"


ME = _Me()
ABSENT = object()  # a field left out


@dataclass(frozen=True)
class Long:
    """A JSON string of ``n`` times ``ch``; short repr for failure reports."""

    ch: str
    n: int

    def __repr__(self) -> str:
        return f"Long({self.ch!r}*{self.n})"


@dataclass(frozen=True)
class Deep:
    """``n`` nested arrays (``[``) or objects (``{``): orjson reads 1024 levels and
    writes 254."""

    kind: str
    n: int

    def render(self) -> str:
        if self.kind == "[":
            return "[" * self.n + "]" * self.n
        return '{"a":' * self.n + "0" + "}" * self.n


@dataclass(frozen=True)
class Frame:
    """One WebSocket frame: ``value`` a JSON tree to render, or (``raw``) the text
    or bytes as they are; ``mangle`` damages the rendered text."""

    kind: str  # "text" or "binary"
    value: Any
    raw: bool = False
    ascii: bool = True
    mangle: str | None = None
    repeat: int = 1  # sent this many times in a row


def _str(s: str, ascii_only: bool) -> str:
    if not ascii_only:
        try:
            s.encode()
        except UnicodeEncodeError:  # a lone surrogate: only as a \u escape
            ascii_only = True
    return json.dumps(s, ensure_ascii=ascii_only)


def dump(v: Any, me: str, ascii_only: bool) -> str:
    """JSON text of ``v`` as a client could write it: NaN/Infinity tokens, ints of
    any size, lone surrogates escaped, ``Long``/``Deep`` built without recursion."""
    if v is ME:
        v = me
    if isinstance(v, Long):
        return _str(v.ch * v.n, ascii_only)
    if isinstance(v, Deep):
        return v.render()
    if isinstance(v, dict):
        return "{" + ",".join(f"{_str(k, ascii_only)}:{dump(x, me, ascii_only)}"
                              for k, x in v.items()) + "}"
    if isinstance(v, list | tuple):
        return "[" + ",".join(dump(x, me, ascii_only) for x in v) + "]"
    if isinstance(v, str):
        return _str(v, ascii_only)
    if isinstance(v, float):
        return json.dumps(v, allow_nan=True)
    return json.dumps(v)  # int, bool, None


MANGLES = {
    "truncate": lambda t: t[: len(t) // 2],
    "bom": lambda t: "\ufeff" + t,
    "trailing": lambda t: t + " x",
    "twice": lambda t: t + t,
    "dup_key": lambda t: '{"op":"ping","id":"dup",' + t[1:] if t.startswith("{") else t,
    "spaces": lambda t: " \n\t" + t + "\r\n",
}


def render(f: Frame, me: str) -> str | bytes:
    text = f.value if f.raw else dump(f.value, me, f.ascii)
    if f.mangle is not None:
        text = MANGLES[f.mangle](text)
    if f.kind == "binary":
        return text if isinstance(text, bytes) else text.encode()
    return text


# -- strategies ---------------------------------------------------------------
ODD_INTS = [MAX_MID, MAX_MID + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64,
            10**30, -1, 0, 1]
ODD_FLOATS = [0.5, -0.0, 1.0, 1e308, 5e-324, float("nan"), float("inf"), float("-inf")]
ODD_STRS = ["", " ", "\x00", "a\x00b", "\ud800", "\udfff", "a\ud83d", "NaN", "Infinity",
            "-Infinity", "null", "true", "$ne", "$where", "a b", "a/b", "..", "../x", "a*",
            "ä", "😀", "\u202e", "\u2028", "g:", "g:x", "a" * 64, "a" * 65, "1e400", "\r\n",
            '{"$ne":null}', "__proto__", "a{b}", "a\\b", "%00", "a?b=c"]
JSON_KEYS = st.one_of(st.text(max_size=8), st.sampled_from(
    ["", "\x00", "a\x00", "$ne", "$where", "$", ".", "a.b", "__proto__", "op", "id", "body",
     "\ud800"]))
_AT_BODY_LIMIT = st.sampled_from([MAX_BODY - 3, MAX_BODY - 2, MAX_BODY - 1, MAX_BODY,
                                  MAX_BODY + 1])
_UP_TO_TWICE = st.integers(0, 2 * MAX_BODY)
_AT_FRAME_LIMIT = st.sampled_from([MAX_FRAME - 64, MAX_FRAME - 40, MAX_FRAME - 20, MAX_FRAME,
                                   MAX_FRAME + 1])
# Around the body limit mostly; around the frame limit one time in eight.
LENGTHS = st.sampled_from([_AT_BODY_LIMIT] * 3 + [_UP_TO_TWICE] * 4 + [_AT_FRAME_LIMIT]
                          ).flatmap(lambda s: s)
# Characters of 1 to 12 bytes in the frame ("😀" escaped in ASCII is 12).
LONG = st.builds(Long, st.one_of(st.just("x"), st.sampled_from(["é", "😀", "\x00", "\\", '"'])),
                 LENGTHS)
DEEP = st.builds(Deep, st.sampled_from(["[", "{"]),
                 st.sampled_from([2, 100, 252, 253, 254, 255, 1000, 1022, 1023, 1024, 1025,
                                  3000]))
# NaN and Infinity (not JSON: the whole frame is refused) only come with HOSTILE, so
# most bodies are JSON the node must store and give back as they are.
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30),
                    st.sampled_from(ODD_STRS), st.sampled_from(ODD_INTS))
JSON = st.recursive(SCALARS, lambda c: st.lists(c, max_size=4)
                    | st.dictionaries(JSON_KEYS, c, max_size=4), max_leaves=16)
HOSTILE = st.one_of(st.sampled_from(ODD_INTS), st.sampled_from(ODD_FLOATS),
                    st.sampled_from(ODD_STRS), st.booleans(), st.none(), st.integers(),
                    st.builds(Long, st.just("x"), st.one_of(_AT_BODY_LIMIT, _UP_TO_TWICE)),
                    st.text(max_size=20),
                    st.sampled_from([[], {}, ["a"], {"$ne": None}, {"$gt": ""}, [1, 2]]))
VALID_ID = st.one_of(st.from_regex(r"[A-Za-z0-9_.:-]{1,64}", fullmatch=True),
                     st.sampled_from(["a", "peer", "g:grp", ":", ".", "-", "a" * 64, "0"]))
IDENT = st.one_of(VALID_ID, VALID_ID, VALID_ID, st.just(ME), HOSTILE)
MID = st.one_of(st.integers(0, MAX_MID), st.integers(0, MAX_MID), HOSTILE)
MIDS = st.one_of(st.lists(MID, max_size=5), st.lists(st.integers(0, MAX_MID), min_size=1,
                                                     max_size=5),
                 st.sampled_from([1000, 1001]).map(lambda n: list(range(n))), HOSTILE)
BODY = st.one_of(JSON, JSON, LONG, DEEP, HOSTILE)  # LONG: up to past the frame limit
PRIO = st.one_of(st.sampled_from([0, 1]), st.sampled_from([2, -1, True, False, "1", 1.0, None,
                                                           2**63, 0.0]))
REQ_ID = st.one_of(st.just(ABSENT), st.integers(-(2**63), 2**64 - 1), st.text(max_size=70),
                   VALID_ID, HOSTILE)
OPS = ["send", "group_send", "join", "leave", "room_send", "recv_ack", "read", "ping"]
FIELDS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "send": {"to": IDENT, "cmid": IDENT, "body": BODY},
    "group_send": {"group": IDENT, "cmid": IDENT, "body": BODY},
    "join": {"room": IDENT},
    "leave": {"room": IDENT},
    "room_send": {"room": IDENT, "body": BODY, "prio": PRIO},
    "recv_ack": {"mids": MIDS},
    "read": {"conv": IDENT, "mid": MID},
    "ping": {},
}


def one_in(n: int) -> st.SearchStrategy[bool]:
    """True about once in ``n`` draws (``st.integers`` favours its bounds)."""
    return st.sampled_from([False] * (n - 1) + [True])


@st.composite
def op_object(draw: st.DrawFn) -> dict[str, Any]:
    """A protocol op, its fields hostile now and then: missing, mistyped, extra."""
    op = draw(HOSTILE) if draw(one_in(6)) else draw(st.sampled_from(OPS))
    obj: dict[str, Any] = {}
    if not draw(one_in(16)):
        obj["op"] = op
    rid = draw(REQ_ID)
    if rid is not ABSENT:
        obj["id"] = rid
    for name, strategy in (FIELDS.get(op, {}) if isinstance(op, str) else {}).items():
        if not draw(one_in(10)):  # one in ten is left out
            obj[name] = draw(strategy)
    if draw(one_in(4)):
        for k, v in draw(st.dictionaries(JSON_KEYS, JSON, min_size=1, max_size=3)).items():
            obj.setdefault(k, v)
    return dict(draw(st.permutations(list(obj.items()))))


# A send the parser takes, with any JSON body: what the store must keep as it is.
SEND_OBJECT = st.fixed_dictionaries(
    {"op": st.just("send"), "id": st.one_of(st.integers(0, 2**64 - 1), VALID_ID),
     "to": VALID_ID, "cmid": VALID_ID, "body": st.one_of(JSON, JSON, JSON, LONG)})


OBJECT_WITH_ID = st.builds(lambda d, i: d if i is ABSENT else {**d, "id": i},
                           st.dictionaries(JSON_KEYS, JSON, max_size=4), REQ_ID)
FRAME = st.one_of(
    st.builds(Frame, st.just("text"), op_object(), ascii=st.booleans()),
    st.builds(Frame, st.just("text"), op_object(), ascii=st.booleans()),
    st.builds(Frame, st.just("text"), op_object(), ascii=st.booleans()),
    st.builds(Frame, st.just("text"), op_object(), ascii=st.booleans()),
    st.builds(Frame, st.just("text"), SEND_OBJECT, ascii=st.booleans()),
    st.builds(Frame, st.just("text"), SEND_OBJECT, ascii=st.booleans()),
    st.builds(Frame, st.just("text"), st.one_of(JSON, OBJECT_WITH_ID, DEEP),
              ascii=st.booleans()),
    st.builds(Frame, st.just("text"), op_object(), mangle=st.sampled_from(sorted(MANGLES))),
    st.builds(Frame, st.just("text"), st.text(max_size=200), raw=st.just(True)),
    st.builds(Frame, st.just("binary"), st.binary(max_size=200), raw=st.just(True)),
    st.builds(Frame, st.just("binary"), op_object()),
)


# A run of the same bad frame up to and past IM_BAD_FRAME_LIMIT: the 1008 close.
BURST = st.builds(Frame, st.just("text"), st.one_of(st.text(max_size=20), op_object()),
                  raw=st.just(False), mangle=st.sampled_from(["truncate", "twice", None]),
                  repeat=st.sampled_from([BAD_FRAME_LIMIT - 1, BAD_FRAME_LIMIT,
                                          BAD_FRAME_LIMIT + 3]))


@st.composite
def example_frames(draw: st.DrawFn) -> list[Frame]:
    """One example: up to 30 frames, and now and then a burst among them."""
    frames = draw(st.lists(FRAME, min_size=1, max_size=30))
    if draw(one_in(8)):
        frames.insert(draw(st.integers(0, len(frames))), draw(BURST))
    return frames


# -- the oracle -----------------------------------------------------------------
def _is_mid(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_MID


def expected_re(payload: str | bytes) -> Any:
    """The ``re`` a reply to this frame must carry, or ABSENT when none is owed:
    not a text frame, not a JSON object (as the wire decoder, orjson, reads it),
    no usable id, or a valid ``recv_ack`` (no reply on success)."""
    if not isinstance(payload, str):
        return ABSENT  # binary frames are outside the contract: no reply is owed
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return ABSENT
    if not isinstance(obj, dict):
        return ABSENT
    rid = obj.get("id")
    if rid is None or isinstance(rid, bool) or not isinstance(rid, str | int):
        return ABSENT
    if isinstance(rid, str) and len(rid) > 64:
        return ABSENT
    mids = obj.get("mids")
    if (obj.get("op") == "recv_ack" and isinstance(mids, list) and 1 <= len(mids) <= 1000
            and all(_is_mid(m) for m in mids)):
        return ABSENT
    return rid


def _reject_constant(name: str) -> None:
    raise ValueError(name)


def _key(rid: Any) -> tuple[str, Any]:
    return type(rid).__name__, rid


@dataclass
class Exchange:
    """What one example's connection saw."""

    frames: list[dict[str, Any]] = field(default_factory=list)
    missing: Counter[tuple[str, Any]] = field(default_factory=Counter)
    close_code: int | None = None
    close_reason: str = ""
    closed: bool = False
    timed_out: bool = False


async def next_frame(ws: Any) -> str | bytes | None:
    """The node's next frame; None once its close frame is in and no frame sent
    before it is left; ConnectionClosed once the TCP connection is gone.

    Why not just ``recv``: when frames follow the one that made the node close
    (1008), the node stops reading them and so never reads the client's close
    reply; it drops the TCP connection only after its ``close_timeout`` (2 s), and
    ``recv`` waits for that. The close code is known as soon as the close frame is
    in, so this looks at ``close_rcvd`` whenever no frame came for CLOSE_POLL_S."""
    recv = asyncio.ensure_future(ws.recv())  # websockets: cancelling recv() is safe
    while True:
        await asyncio.wait({recv}, timeout=CLOSE_POLL_S)
        if recv.done():
            return recv.result()
        if ws.protocol.close_rcvd is not None:
            recv.cancel()
            return None


async def exchange(port: int, me: str, payloads: list[str | bytes]) -> Exchange:
    """Send the frames on a fresh connection, then a ping; read until every owed
    reply and the pong are in, or the node closes, or REPLY_WAIT_S passes."""
    out = Exchange()
    end_id = f"end-{uuid.uuid4().hex}"
    owed = Counter(_key(r) for r in map(expected_re, payloads) if r is not ABSENT)
    owed[_key(end_id)] += 1
    # close_timeout: after the close handshake, how long the client waits for the
    # node to drop TCP (see next_frame) before dropping it itself.
    async with ws_connect(f"ws://127.0.0.1:{port}/ws?token={token(me)}", compression=None,
                          proxy=None, ping_interval=None, open_timeout=10, close_timeout=0.2,
                          max_size=None) as ws:
        try:
            for p in payloads:
                await ws.send(p)
            await ws.send(orjson.dumps({"op": "ping", "id": end_id}).decode())
        except ConnectionClosed:
            pass  # the node closed meanwhile: judged below by its close code
        try:
            async with asyncio.timeout(REPLY_WAIT_S):
                while +owed:
                    data = await next_frame(ws)
                    if data is None:
                        out.closed = True
                        break
                    assert isinstance(data, str), f"binary frame from the node: {data[:200]!r}"
                    frame = orjson.loads(data)
                    assert isinstance(frame, dict) and isinstance(frame.get("op"), str), data
                    out.frames.append(frame)
                    if "re" in frame and owed[_key(frame["re"])] > 0:
                        owed[_key(frame["re"])] -= 1
        except ConnectionClosed:
            out.closed = True
        except TimeoutError:
            out.timed_out = True
        out.missing = +owed
        rcvd = ws.protocol.close_rcvd
        if out.closed:
            out.close_code = rcvd.code if rcvd is not None else None
            out.close_reason = rcvd.reason if rcvd is not None else ""
    return out


# -- the test ---------------------------------------------------------------------
@dataclass
class Run:
    """What the examples share: the node's ports, an HTTP client, a receiver, stats."""

    node: Any
    http: httpx.AsyncClient
    receiver: str
    stats: Counter[str] = field(default_factory=Counter)


async def check_example(run: Run, frames: list[Frame]) -> list[str]:
    """One example; its events for the statistics. Fails with the rendered frames."""
    me = uid("fz")
    payloads = [render(f, me) for f in frames for _ in range(f.repeat)]
    events: list[str] = []
    sent_text = "".join(p if isinstance(p, str) else p.decode(errors="replace")
                        for p in payloads)
    shown = [p if len(p) < 300 else p[:300] + b"..." if isinstance(p, bytes) else p[:300] + "..."
             for p in payloads]
    why = f"user {me}, frames {shown!r}"
    ex = await exchange(run.node.ws_port, me, payloads)

    # Closes: only the documented ones, each for its documented reason.
    if ex.closed:
        events.append(f"closed {ex.close_code}")
        assert ex.close_code != 1011, f"node closed with 1011 (internal error): {why}"
        errors_seen = sum(1 for f in ex.frames if f["op"] == "error")
        if ex.close_code == 1009:
            assert any(len(p if isinstance(p, bytes) else p.encode()) > MAX_FRAME
                       for p in payloads), f"1009 without a frame over the limit: {why}"
        elif ex.close_code == 1008:
            assert ex.close_reason == "too many bad frames" and errors_seen >= BAD_FRAME_LIMIT, (
                f"1008 ({ex.close_reason!r}) after {errors_seen} errors: {why}")
        else:
            raise AssertionError(f"node closed with {ex.close_code} {ex.close_reason!r}: {why}")
    else:
        assert not ex.timed_out, f"no reply within {REPLY_WAIT_S}s to {dict(ex.missing)}: {why}"
        assert not ex.missing, f"no reply to {dict(ex.missing)}: {why}"

    # Every error: a contract code, not internal, a message without internals.
    for f in ex.frames:
        if f["op"] != "error":
            continue
        events.append(f"error {f.get('code')}")
        assert f.get("code") in CODES, f"error code {f.get('code')!r}: {why}"
        assert f["code"] != "internal", f"internal error (an exception in the node): {f} {why}"
        msg = f.get("message")
        assert isinstance(msg, str) and msg, f"error without a message: {f} {why}"
        leaked = [m for m in LEAK_MARKERS if m in msg and m not in sent_text]
        assert not leaked, f"error message leaks {leaked}: {msg!r} {why}"

    # An acked send reads back identical; checked on the last ack whose cmid the
    # example used once (a repeated cmid keeps whichever body was stored first).
    sends = []
    for p in payloads:
        try:
            obj = orjson.loads(p)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("op") in ("send", "group_send"):
            sends.append(obj)
    cmids = Counter(s.get("cmid") for s in sends if isinstance(s.get("cmid"), str))
    acks = [f for f in ex.frames if f["op"] == "ack"]
    events += ["ack"] * len(acks)
    for ack in reversed(acks):
        mine = [s for s in sends if s.get("op") == "send" and s.get("cmid") == ack["cmid"]]
        if len(mine) != 1 or cmids[ack["cmid"]] != 1:
            continue
        r = await HttpUser(run.node.http_port, token(me), client=run.http).get(
            "/v1/sync", params={"since": ack["mid"] - 1, "limit": 1})
        assert r.status_code == 200, f"{r.status_code} {r.text[:300]}: {why}"
        page = orjson.loads(r.content)
        assert page["msgs"], f"acked mid {ack['mid']} not in sync: {why}"
        got = page["msgs"][0]
        assert (got["mid"], got["from"], got["to"]) == (ack["mid"], me, mine[0]["to"]), why
        # The node keeps a body as the bytes orjson makes of it and serves those
        # bytes as they are: they must be in the answer, byte for byte.
        stored = orjson.dumps(mine[0]["body"])
        assert b'"body":' + stored in r.content, (
            f"body of mid {ack['mid']} read back as {orjson.dumps(got['body'])[:300]!r}, "
            f"sent {stored[:300]!r}: {why}")
        events.append("body read back")
        break

    # The node stays healthy for everyone else.
    other = await Device.open(run.node.ws_port, token(uid("hc")))
    try:
        assert (await other.request("ping", timeout=REPLY_WAIT_S))["op"] == "pong", why
        ack = await other.request("send", timeout=REPLY_WAIT_S, to=run.receiver,
                                  cmid=uid("c"), body={"after": me})
        assert ack["op"] == "ack", f"healthy user's send answered {ack}: {why}"
    finally:
        await other.close()
    return events


@pytest.mark.edge_only
async def test_ws_frames_fuzz_node_answers_and_stays_healthy(make_node, caplog):
    node = await make_node(max_body=MAX_BODY, max_frame=MAX_FRAME,
                           bad_frame_limit=BAD_FRAME_LIMIT)
    caplog.set_level(logging.ERROR)
    async with httpx.AsyncClient(timeout=REPLY_WAIT_S, trust_env=False) as client:
        run = Run(node, client, uid("rcv"))

        examples: list[list[Frame]] = []

        @settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None,
                  phases=[Phase.generate],
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.large_base_example])
        @given(frames=example_frames())
        def collect(frames: list[Frame]) -> None:
            examples.append(frames)

        collect()  # generation only (pure): the examples then run on this loop, in order
        assert len(examples) == MAX_EXAMPLES
        for frames in examples:
            async with asyncio.timeout(EXAMPLE_BOUND_S):
                events = await check_example(run, frames)
            run.stats.update(set(events))

        # At the end the node still serves: health, a fresh round trip, nothing logged.
        r = await client.get(f"http://127.0.0.1:{node.http_port}/healthz")
        assert r.status_code == 200, r.text
        assert not node.draining
        d = await Device.open(node.ws_port, token(uid("end")))
        try:
            assert (await d.request("ping"))["op"] == "pong"
        finally:
            await d.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [f"{r.name}: {r.getMessage()}" for r in errors]
    # The fuzz reached past the parser: sends stored and read back, errors, closes.
    print("examples per event:", dict(sorted(run.stats.items())))
    assert run.stats["ack"] and run.stats["body read back"] and run.stats["error bad_request"]


@pytest.mark.parametrize("frame", [
    '{"op":"ping","id":18446744073709551616,"x":"\\ud800"}',
    '{"id":-9223372036854775809,"\\ud800":null}',
])
async def test_a_lone_surrogate_frame_with_an_id_past_64_bits_is_answered(node, frame):
    """Found by this fuzz: such a frame once closed the connection with 1011 (the
    stdlib's unbounded id went into ``re``, which orjson could not write)."""
    async with ws_connect(f"ws://127.0.0.1:{node.ws_port}/ws?token={token(uid())}",
                          compression=None, proxy=None, ping_interval=None,
                          close_timeout=2) as ws:
        await ws.send(frame)
        await ws.send('{"op":"ping","id":"after"}')
        replies: list[Any] = []
        with contextlib.suppress(ConnectionClosed):
            async with asyncio.timeout(REPLY_WAIT_S):
                while not replies or replies[-1].get("re") != "after":
                    replies.append(orjson.loads(await ws.recv()))
        assert ws.protocol.close_rcvd is None, ws.protocol.close_rcvd
    assert replies[0]["op"] == "error" and replies[0]["code"] == "bad_request", replies
    assert replies[-1] == {"op": "pong", "re": "after"}, replies
