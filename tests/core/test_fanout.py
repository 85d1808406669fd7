"""The pure parts of room fan-out: cap, sampling, frames, wire bytes."""

from __future__ import annotations

import random

import orjson
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from gateway.rooms.coalesce import DeliveryCap, room_frames, sample
from gateway.wire import ws_text_frame


def test_cap_refills_by_time_and_prio_spends_tokens():
    cap = DeliveryCap(rate=10, burst=10, now=0.0)
    assert cap.allow(0.0, prio=0, normal=25) == 10  # the burst
    assert cap.allow(0.05, prio=0, normal=25) == 0  # half a token
    assert cap.allow(0.5, prio=0, normal=25) == 5  # 5.5 tokens
    assert cap.allow(1.5, prio=4, normal=25) == 6  # 10.5 tokens - 4 prio
    assert cap.allow(1.6, prio=50, normal=3) == 0  # prio ran the bucket dry


def test_no_cap_lets_everything_through():
    assert DeliveryCap(rate=0, burst=1, now=0).allow(0.0, 7, 1000) == 1000


def test_sample_keeps_all_prio_and_order():
    frags = [str(i).encode() for i in range(100)]
    prios = [1 if i % 10 == 0 else 0 for i in range(100)]
    kept = sample(frags, prios, 5, random.Random(1))
    nums = [int(f) for f in kept]
    assert nums == sorted(nums)
    assert [n for n in nums if n % 10 == 0] == list(range(0, 100, 10))
    assert len([n for n in nums if n % 10]) == 5
    only_prio = [f for f, p in zip(frags, prios, strict=True) if p]
    assert sample(frags, prios, 0, random.Random(1)) == only_prio
    assert sample(frags, prios, 1000, random.Random(1)) == frags


def test_sample_is_uniform_enough():
    counts = [0] * 10
    rng = random.Random(7)
    for _ in range(2000):
        for f in sample([bytes([i]) for i in range(10)], [0] * 10, 3, rng):
            counts[f[0]] += 1
    assert min(counts) > 450 and max(counts) < 750  # expected 600 each


def test_room_frames_split_by_size_and_stay_valid_json():
    frags = [orjson.dumps({"from": "u", "body": "x" * 50, "ts": i}) for i in range(40)]
    frames = room_frames("r.1", frags, 1000)
    assert len(frames) > 1 and all(len(f) <= 1000 for f in frames)
    msgs = [m for f in frames for m in orjson.loads(f)["msgs"]]
    assert [m["ts"] for m in msgs] == list(range(40))
    assert {orjson.loads(f)["room"] for f in frames} == {"r.1"}
    assert len(room_frames("r", [b'"' + b"y" * 5000 + b'"'], 100)) == 1  # oversize alone


def _parse(wire: bytes) -> Frame:
    reader = StreamReader()
    reader.feed_data(wire)
    gen = Frame.parse(reader.read_exact, mask=False)
    try:
        next(gen)
    except StopIteration as done:
        return done.value
    raise AssertionError("incomplete frame")


def test_wire_frames_parse_as_websocket_text_frames():
    for n in (0, 125, 126, 65_535, 65_536, 200_000):
        payload = b"a" * n
        frame = _parse(ws_text_frame(payload))
        assert frame.opcode is Opcode.TEXT and frame.fin and frame.data == payload
