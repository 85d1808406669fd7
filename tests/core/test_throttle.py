"""core.throttle: one per key per interval, bounded memory."""

from __future__ import annotations

from core.throttle import Throttle
from gateway import protocol as p
from gateway.errors import ProtocolError


def test_one_per_key_per_interval():
    t = Throttle(2.0)
    assert t.allow(("a", "b"), 0.0)
    assert not t.allow(("a", "b"), 1.9)
    assert t.allow(("a", "c"), 1.9)  # another conversation
    assert t.allow(("a", "b"), 2.0)


def test_memory_is_bounded_and_expired_keys_go():
    t = Throttle(2.0, max_keys=3)
    for i in range(10):
        assert t.allow(i, 0.0)
    assert len(t) == 3
    assert t.allow("late", 5.0)
    assert len(t) == 1  # everything older than the interval was dropped


def test_recall_and_typing_frames_parse_and_refuse_bad_fields():
    assert p.parse_frame(b'{"op":"recall","id":1,"mid":42}', 4096) == p.Recall(1, 42)
    assert p.parse_frame(b'{"op":"typing","conv":"g:x"}', 4096) == p.Typing(None, "g:x")
    for bad in (b'{"op":"recall","id":1,"mid":-1}', b'{"op":"recall","mid":"7"}',
                b'{"op":"typing","conv":"a b"}', b'{"op":"typing"}'):
        try:
            p.parse_frame(bad, 4096)
        except ProtocolError as err:
            assert err.code == "bad_request"
        else:
            raise AssertionError(bad)
