"""One user on a node's HTTP API: the bearer token on every request.

Many users may share one ``httpx.AsyncClient`` (one connection pool): pass it
as ``client``; the owner closes it. Without one, the user has its own.
``HttpUsers`` is a node's users on one shared client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx

from testkit.tokens import issue_token

__all__ = ["HttpError", "HttpUser", "HttpUsers", "http_url"]

UNAVAILABLE_TRIES = 3


class HttpError(RuntimeError):
    """An answer other than 200 where only 200 would do."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"{response.request.method} {response.request.url.path}: "
                         f"{response.status_code} {response.text[:300]}")
        self.response = response


def http_url(where: int | str) -> str:
    """The node's HTTP base: a port of 127.0.0.1, or an ``http://`` URL as is."""
    return where.rstrip("/") if isinstance(where, str) else f"http://127.0.0.1:{where}"


class HttpUser:
    """``user``'s requests to the node at ``where`` (port or URL), signed by ``token``."""

    def __init__(self, where: int | str, token: str, *,
                 client: httpx.AsyncClient | None = None, timeout: float = 10) -> None:
        self.base = http_url(where)
        self.headers = {"Authorization": f"Bearer {token}"}
        self._own = client is None
        self.client = client or httpx.AsyncClient(timeout=timeout, trust_env=False)

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {**self.headers, **kw.pop("headers", {})}
        return await self.client.request(method, self.base + path, headers=headers, **kw)

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        return await self.request("GET", path, **kw)

    async def post(self, path: str, **kw: Any) -> httpx.Response:
        return await self.request("POST", path, **kw)

    async def delete(self, path: str, **kw: Any) -> httpx.Response:
        return await self.request("DELETE", path, **kw)

    async def patch(self, path: str, **kw: Any) -> httpx.Response:
        return await self.request("PATCH", path, **kw)

    async def ok(self, method: str, path: str, **kw: Any) -> Any:
        """The decoded answer; HttpError unless it is a 200. A 503 (``unavailable``:
        a store that timed out under the test run's load) is asked again, as a
        client does, at most ``UNAVAILABLE_TRIES`` times."""
        for attempt in range(UNAVAILABLE_TRIES):
            r = await self.request(method, path, **kw)
            if r.status_code != 503 or attempt == UNAVAILABLE_TRIES - 1:
                break
            await asyncio.sleep(0.5 * (attempt + 1))
        if r.status_code != 200:
            raise HttpError(r)
        return r.json()

    async def sync_pages(self, since: int = 0, limit: int = 200,
                         max_pages: int = 1000) -> AsyncIterator[dict[str, Any]]:
        """``GET /v1/sync`` from ``since``, page after page until ``more`` is false
        (at most ``max_pages``); HttpError on an answer other than 200."""
        for _ in range(max_pages):
            page = await self.ok("GET", "/v1/sync", params={"since": since, "limit": limit})
            yield page
            if not page["more"] or page["next"] <= since:
                return
            since = page["next"]

    async def sync_all(self, since: int = 0, limit: int = 200) -> tuple[list[dict[str, Any]], int]:
        """Every message after ``since`` (all pages), and the cursor to go on from."""
        msgs: list[dict[str, Any]] = []
        cursor = since
        async for page in self.sync_pages(since, limit):
            msgs += page["msgs"]
            cursor = page["next"]
        return msgs, cursor

    async def aclose(self) -> None:
        if self._own:
            await self.client.aclose()


class HttpUsers:
    """Any number of users on one node, sharing one client (one connection pool):
    ``users["alice"]`` is alice's ``HttpUser``, made (and its token issued) once."""

    def __init__(self, where: int | str, secret: str, *, timeout: float = 60,
                 limits: httpx.Limits | None = None) -> None:
        self.where, self.secret = where, secret
        self.client = httpx.AsyncClient(timeout=timeout, trust_env=False,
                                        limits=limits or httpx.Limits())
        self._users: dict[str, HttpUser] = {}

    def __getitem__(self, user: str) -> HttpUser:
        if user not in self._users:
            self._users[user] = HttpUser(self.where, issue_token(self.secret, user),
                                         client=self.client)
        return self._users[user]

    async def aclose(self) -> None:
        await self.client.aclose()
