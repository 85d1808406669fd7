"""Pure pieces: mids, sync cursors, the token bucket, tokens, settings."""

from __future__ import annotations

import time

import jwt
import pytest

from core.cursors import next_cursor
from core.ids import (
    EPOCH_MS,
    MAX_MID,
    MidGenerator,
    mid_for_time_ms,
    mid_time_ms,
)
from core.ratelimit import TokenBucket
from gateway.auth import bearer_token, issue_token, verify_token
from gateway.config import ConfigError, Settings
from gateway.errors import ProtocolError

SECRET = "x" * 32


def test_mids_increase_and_fit_53_bits():
    gen = MidGenerator(255)
    mids = [gen.next() for _ in range(10_000)]
    assert mids == sorted(set(mids))
    assert all(0 < m <= MAX_MID < 2**53 for m in mids)


def test_mids_borrow_the_next_millisecond_instead_of_repeating():
    gen = MidGenerator(3, clock_ms=lambda: EPOCH_MS + 1000)
    mids = [gen.next() for _ in range(40)]  # 16 per ms: borrows two ms ahead
    assert mids == sorted(set(mids))
    assert mid_time_ms(mids[0]) == EPOCH_MS + 1000
    assert mid_time_ms(mids[-1]) == EPOCH_MS + 1002


def test_mids_survive_clock_going_back():
    now = [EPOCH_MS + 5000]
    gen = MidGenerator(1, clock_ms=lambda: now[0])
    a = gen.next()
    now[0] -= 2000
    assert gen.next() > a


def test_nodes_never_collide_in_one_millisecond():
    a = MidGenerator(1, clock_ms=lambda: EPOCH_MS + 7)
    b = MidGenerator(2, clock_ms=lambda: EPOCH_MS + 7)
    assert {a.next() for _ in range(16)}.isdisjoint(b.next() for _ in range(16))


def test_mid_time_roundtrip_and_bounds():
    t = EPOCH_MS + 123_456
    assert mid_time_ms(mid_for_time_ms(t)) == t
    assert mid_for_time_ms(0) == 0
    with pytest.raises(ValueError):
        MidGenerator(256)


def test_cursor_stays_behind_the_settle_horizon():
    assert next_cursor(10, [], False, 100) == 10
    assert next_cursor(10, [20, 30], False, 100) == 30
    assert next_cursor(10, [20, 150], False, 100) == 20  # 150 may still have company
    assert next_cursor(10, [120, 150], False, 100) == 10
    assert next_cursor(10, [120, 150], True, 100) == 150  # a full page passes the horizon
    # ...never the bound (below a send that may still land): a page read now lacks it
    assert next_cursor(10, [20, 150], False, 100, 30) == 20
    assert next_cursor(10, [20, 150], False, 100, 5) == 10
    assert next_cursor(10, [20, 120, 150], True, 100, 130) == 120
    assert next_cursor(10, [120, 150], True, 100, 119) == 10


def test_token_bucket():
    b = TokenBucket(rate=10, burst=2, now=0.0)
    assert b.take(0.0) and b.take(0.0) and not b.take(0.0)
    assert b.take(0.1) and not b.take(0.1)
    assert b.take(10.0) and b.take(10.0) and not b.take(10.0)  # burst caps the saving


def test_tokens():
    tok = issue_token(SECRET, "alice", 60)
    assert verify_token(SECRET, tok) == "alice"
    assert bearer_token(f"Bearer {tok}") == tok and bearer_token("Basic x") is None
    expired = jwt.encode({"sub": "a", "exp": int(time.time()) - 10}, SECRET, "HS256")
    no_exp = jwt.encode({"sub": "a"}, SECRET, "HS256")
    bad_sub = jwt.encode({"sub": "a b", "exp": int(time.time()) + 60}, SECRET, "HS256")
    none_alg = jwt.encode({"sub": "a", "exp": int(time.time()) + 60}, "", "none")
    for t in (None, "", "junk", expired, no_exp, bad_sub, none_alg,
              issue_token("y" * 32, "alice")):
        with pytest.raises(ProtocolError) as info:
            verify_token(SECRET, t)
        assert info.value.code == "unauthorized"


def test_settings_from_env():
    s = Settings.from_env({"IM_NAMESPACE": "abc", "IM_WS_PORT": "9000", "IM_NODE_ID": "7",
                           "IM_DEP_TIMEOUT_S": "1.5"})
    assert (s.namespace, s.ws_port, s.node_id, s.dep_timeout_s) == ("abc", 9000, 7, 1.5)
    for bad in ({"IM_WS_PORT": "x"}, {"IM_NAMESPACE": "a:b"}, {"IM_NODE_ID": "300"},
                {"IM_AUTH_SECRET": "short"}):
        with pytest.raises(ConfigError):
            Settings.from_env(bad)


def test_cluster_urls_are_checked_at_start_up():
    s = Settings.from_env({"IM_REDIS_CLUSTER": "1",
                           "IM_REDIS_URL": "redis://127.0.0.1:7001, redis://127.0.0.1:7002",
                           "IM_AMQP_URL": "amqp://g:p@127.0.0.1:5681/,amqp://g:p@127.0.0.1:5682/"})
    assert s.redis_cluster == 1
    for bad, named in (({"IM_REDIS_CLUSTER": "1", "IM_REDIS_URL": "redis://a:1,http://b"},
                        "IM_REDIS_URL"),
                       ({"IM_REDIS_CLUSTER": "1", "IM_REDIS_URL": "redis://a:1/3"},
                        "IM_REDIS_URL"),
                       ({"IM_REDIS_CLUSTER": "2"}, "IM_REDIS_CLUSTER"),
                       ({"IM_AMQP_URL": "amqp://a/,,amqp://b/"}, "IM_AMQP_URL item 2 of 3"),
                       ({"IM_AMQP_URL": "redis://a/"}, "IM_AMQP_URL item 1 of 1"),
                       ({"IM_CORS_ORIGINS": "https://a.example,evil"}, "IM_CORS_ORIGINS"),
                       ({"IM_CORS_ORIGINS": "https://a.example/path"}, "IM_CORS_ORIGINS")):
        with pytest.raises(ConfigError, match=named):
            Settings.from_env(bad)
    # One plain Redis URL with a database is fine without cluster mode.
    assert Settings.from_env({"IM_REDIS_URL": "redis://127.0.0.1:6379/3"}).redis_cluster == 0
