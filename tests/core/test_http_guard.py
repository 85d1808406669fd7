"""The HTTP edge's pure parts: per-user buckets (bounded, idle ones dropped) and
the id types every HTTP route uses."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from core.ratelimit import KeyedBuckets
from gateway.http.models import Id, NewMembers, UserId

BAD_IDS = ["a*", "{x}", "a b", "a\x00", "a\n", "$where", "x}{y", "été", "", "x" * 65,
           "a/b", "a\\b"]


def test_buckets_limit_each_user_alone():
    b = KeyedBuckets(rate=1, burst=3)
    assert [b.take("flood", 0.0) for _ in range(5)] == [True, True, True, False, False]
    assert b.take("calm", 0.0)  # another user's bucket is its own
    assert b.retry_after("flood") == 1
    assert b.take("flood", 1.0) and not b.take("flood", 1.0)


def test_idle_buckets_are_dropped_and_the_map_is_bounded():
    b = KeyedBuckets(rate=10, burst=10, max_users=100)
    for i in range(50):
        b.take(f"u{i}", 0.0)
    assert len(b) == 50
    b.take("late", 5.0)  # 1 s refills a bucket: everyone idle that long is dropped
    assert len(b) == 1
    for i in range(500):
        b.take(f"v{i}", 6.0)
    assert len(b) == 100


def test_rate_zero_means_no_limit():
    b = KeyedBuckets(rate=0, burst=1)
    assert all(b.take("u", 0.0) for _ in range(1000)) and len(b) == 0


@pytest.mark.parametrize("bad", BAD_IDS)
def test_ids_match_whole_values(bad):
    for kind in (Id, UserId):
        with pytest.raises(ValidationError):
            TypeAdapter(kind).validate_python(bad)
    with pytest.raises(ValidationError):
        NewMembers.model_validate({"members": ["ok", bad]})


def test_user_ids_may_not_name_groups():
    assert TypeAdapter(Id).validate_python("g:team") == "g:team"
    with pytest.raises(ValidationError, match="g:"):
        TypeAdapter(UserId).validate_python("g:team")
    assert TypeAdapter(UserId).validate_python("a.b:c-d_9") == "a.b:c-d_9"
    with pytest.raises(ValidationError):
        TypeAdapter(UserId).validate_python(7)  # strict: no number becomes an id


async def test_the_http_app_is_built_on_its_first_request_and_once():
    from fastapi import FastAPI

    from gateway.http.api import LazyHttp

    built: list[FastAPI] = []

    def build() -> FastAPI:
        app = FastAPI()

        @app.get("/x")
        async def x() -> dict[str, int]:
            return {"builds": len(built)}

        built.append(app)
        return app

    lazy = LazyHttp(build)
    assert built == []  # nothing analysed before a request

    async def get() -> bytes:
        sent: list[dict[str, object]] = []

        async def receive() -> dict[str, object]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/x", "raw_path": b"/x",
                 "query_string": b"", "headers": [], "http_version": "1.1",
                 "scheme": "http", "server": ("127.0.0.1", 1), "client": ("127.0.0.1", 2),
                 "root_path": ""}
        await lazy(scope, receive, send)  # type: ignore[arg-type]
        return b"".join(m.get("body", b"") for m in sent)  # type: ignore[misc]

    assert await get() == b'{"builds":1}'
    assert await get() == b'{"builds":1}'
    assert len(built) == 1 and lazy.app is built[0]
