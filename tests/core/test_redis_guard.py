"""store.redis_client.redis_guard: every error of the Redis clients becomes
``Unavailable`` with the error's class name only (no driver text for clients);
anything else passes through. No server: the errors are raised directly."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ClusterDownError, RedisClusterException, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from core.errors import Unavailable
from store.redis_client import redis_guard


@pytest.mark.parametrize("exc", [
    RedisConnectionError("refused"), ClusterDownError("CLUSTERDOWN"),
    RedisClusterException("slots not covered"), ResponseError("OOM"), OSError("reset"),
    RuntimeError("readuntil() called while another coroutine is already waiting"),
])
async def test_client_errors_become_unavailable(exc: Exception) -> None:
    with pytest.raises(Unavailable) as info:
        async with redis_guard():
            raise exc
    assert str(info.value) == f"redis unavailable: {type(exc).__name__}"


async def test_a_runtime_error_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="store.redis"), pytest.raises(Unavailable):
        async with redis_guard():
            raise RuntimeError("two readers")
    [record] = caplog.records
    assert record.exc_info is None and "two readers" in record.getMessage()


async def test_other_errors_pass_through() -> None:
    with pytest.raises(KeyError):
        async with redis_guard():
            raise KeyError("a bug is a bug")


def _raise_from(filename: str) -> None:
    """An AttributeError whose last frame is in ``filename``."""
    code = compile("def broken():\n    None.writelines([])\n", filename, "exec")
    scope: dict[str, object] = {}
    exec(code, scope)
    scope["broken"]()  # type: ignore[operator]


async def test_an_attribute_error_from_inside_the_driver_is_unavailable() -> None:
    with pytest.raises(Unavailable) as info:
        async with redis_guard():
            _raise_from("/site-packages/redis/asyncio/connection.py")
    assert str(info.value) == "redis unavailable: AttributeError"


async def test_an_attribute_error_of_our_own_is_a_bug_and_passes_through() -> None:
    with pytest.raises(AttributeError):
        async with redis_guard():
            _raise_from("/work/store/offline_redis.py")
