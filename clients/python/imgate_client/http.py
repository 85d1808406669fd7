"""A small HTTP/1.1 client for the node's JSON API (the SDK depends on nothing
but ``websockets`` and ``orjson``): one keep-alive connection per base URL, one
request at a time, ``Content-Length`` and chunked answers, TLS for https.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson

__all__ = ["HttpClient", "HttpError"]

_MAX_HEAD = 64 * 1024
_MAX_BODY = 64 * 1024 * 1024


class HttpError(Exception):
    """An answer other than 2xx: its status, and the API's error code and message."""

    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        self.status = status
        self.body = body
        self.code: str | None = None
        self.message = body[:300].decode(errors="replace")
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            err = orjson.loads(body)["error"]
            self.code, self.message = str(err["code"]), str(err.get("message", ""))
        super().__init__(f"{method} {path}: {status} {self.code or ''} {self.message}".strip())


class HttpClient:
    """Requests to one ``http(s)://host:port[/prefix]`` (see the module docstring)."""

    def __init__(self, base_url: str, *, timeout: float = 10.0) -> None:
        u = urlsplit(base_url.rstrip("/"))
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.host = u.hostname
        self.tls = u.scheme == "https"
        self.port = u.port or (443 if self.tls else 80)
        self.prefix = u.path
        self.timeout = timeout
        self._lock = asyncio.Lock()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                      json: Any = None, headers: dict[str, str] | None = None
                      ) -> tuple[int, bytes]:
        """``(status, body)`` of one request; OSError / TimeoutError if the node cannot
        be reached or does not answer within ``timeout``."""
        target = self.prefix + path + (f"?{urlencode(params)}" if params else "")
        body = b"" if json is None else orjson.dumps(json)
        head = [f"{method} {target} HTTP/1.1", f"Host: {self.host}:{self.port}",
                "Accept: application/json", f"Content-Length: {len(body)}"]
        if json is not None:
            head.append("Content-Type: application/json")
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        data = ("\r\n".join(head) + "\r\n\r\n").encode() + body
        async with self._lock:
            try:
                async with asyncio.timeout(self.timeout):
                    return await self._send(data, method)
            except BaseException:  # timed out or cancelled mid-answer: the socket is spent
                self._drop()
                raise

    async def _send(self, data: bytes, method: str) -> tuple[int, bytes]:
        for attempt in range(2):
            reused = self._writer is not None
            try:
                if self._writer is None:
                    await self._open()
                return await self._exchange(data, method)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    ValueError) as exc:
                self._drop()
                # A kept-alive connection the server closed meanwhile: once more.
                if not reused or attempt:
                    if isinstance(exc, asyncio.IncompleteReadError):  # as documented: OSError
                        raise ConnectionError("the node closed the connection before "
                                              "answering") from exc
                    if isinstance(exc, asyncio.LimitOverrunError):
                        raise ValueError("response head too large") from exc
                    raise
        raise AssertionError("unreachable")

    async def json(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                   json: Any = None, headers: dict[str, str] | None = None) -> Any:
        """The decoded answer of a 2xx; HttpError otherwise."""
        status, body = await self.request(method, path, params=params, json=json,
                                          headers=headers)
        if not 200 <= status < 300:
            raise HttpError(method, path, status, body)
        return orjson.loads(body) if body else None

    async def _open(self) -> None:
        ctx = ssl.create_default_context() if self.tls else None
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port, ssl=ctx)

    async def _exchange(self, data: bytes, method: str) -> tuple[int, bytes]:
        assert self._reader is not None and self._writer is not None
        self._writer.write(data)
        await self._writer.drain()
        head = await self._reader.readuntil(b"\r\n\r\n")
        if len(head) > _MAX_HEAD:
            raise ValueError("response head too large")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.x answer: {lines[0]!r}")
        status = int(parts[1])
        fields: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                fields[name.strip().lower()] = value.strip()
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            body = b""
        elif "chunked" in fields.get("transfer-encoding", "").lower():
            body = await self._chunked()
        elif "content-length" in fields:
            n = int(fields["content-length"])
            if n > _MAX_BODY:
                raise ValueError("response body too large")
            body = await self._reader.readexactly(n)
        else:  # until the server closes
            body = await self._reader.read(_MAX_BODY)
            self._drop()
        if fields.get("connection", "").lower() == "close" or parts[0] == "HTTP/1.0":
            self._drop()
        return status, body

    async def _chunked(self) -> bytes:
        assert self._reader is not None
        out = bytearray()
        while True:
            size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                while (await self._reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                return bytes(out)
            out += await self._reader.readexactly(size)
            await self._reader.readexactly(2)
            if len(out) > _MAX_BODY:
                raise ValueError("response body too large")

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.transport.abort()
        self._reader = self._writer = None

    async def close(self) -> None:
        self._drop()
