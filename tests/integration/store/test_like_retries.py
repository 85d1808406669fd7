"""A like or unlike answered ``unavailable`` after part of it was done (its row
written or removed in MongoDB, the count's move then failing on Redis) moves
the count once when the client retries: never a like row the count misses,
nor a count for a row that is gone.

The node reaches a private redis-server through a TCP proxy that is cut
mid-call and restored.
"""

from __future__ import annotations

import pytest

from testkit.poll import until
from tests.conftest import uid
from tests.integration.gateway.test_feed import bind, post
from tests.integration.gateway.test_feed_more import likes

pytestmark = pytest.mark.own_redis  # a plain Redis of its own: the cluster pass skips it


async def test_a_like_and_an_unlike_cut_off_from_redis_count_once_when_retried(
        private, proxy, make_node, http, mongo_db):
    redis = await private("redis")
    link = await proxy(redis.port)
    node = await make_node(redis_url=link.url("redis"), redis_cluster=0, dep_timeout_s=0.5)
    h = bind(http, node)
    author, fan, other = uid("a"), uid("f"), uid("o")
    p = await post(h, author, "like me")
    assert (await h(other).post(f"/v1/posts/{p}/like")).status_code == 200

    async def retried(method: str) -> None:
        """The call while Redis is cut off: ``unavailable``; then retried."""
        link.cut()
        r = await h(fan).request(method, f"/v1/posts/{p}/like")
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable", r.text
        link.restore()

        async def done() -> bool:
            r = await h(fan).request(method, f"/v1/posts/{p}/like")
            assert r.status_code in (200, 503), r.text
            return r.status_code == 200

        assert await until(done, timeout=20, every=0.2)

    await retried("POST")
    # the first try's row was written before the count's move failed
    assert await mongo_db.likes.find_one({"_id": f"{p}|{fan}"}) is not None
    assert await likes(h, author, p) == 2
    await retried("DELETE")
    assert await mongo_db.likes.find_one({"_id": f"{p}|{fan}"}) is None
    assert await likes(h, author, p) == 1
    for _ in range(2):  # and both again, undisturbed
        assert (await h(fan).post(f"/v1/posts/{p}/like")).status_code == 200
    assert await likes(h, author, p) == 2
    assert (await h(fan).delete(f"/v1/posts/{p}/like")).status_code == 200
    assert await likes(h, author, p) == 1
