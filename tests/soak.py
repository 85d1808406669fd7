"""A chat soak with failover clients, for failure tests.

Each user holds one WebSocket to one of the nodes, sends to the next user in
a ring at a fixed rate with one send in flight, retries the same ``cmid`` on
``unavailable``, a timeout or a lost connection, and on (re)connect syncs over
HTTP from its cursor (the ``next`` of its last sync), as a real client does.
At the end every user syncs once more. The counts tell whether every
acknowledged message reached its receiver, by push or by sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from tests.conftest import token


@dataclass
class Endpoint:
    ws_port: int
    http_port: int
    up: bool = True


@dataclass
class SoakUser:
    name: str
    home: int  # index of the first endpoint tried
    cursor: int = 0
    ws: ClientConnection | None = None
    at: int = -1
    received: dict[int, str] = field(default_factory=dict)  # mid -> "push" | "sync"
    acked: dict[str, int] = field(default_factory=dict)  # cmid -> mid
    errors: Counter[str] = field(default_factory=Counter)
    reconnects: int = 0
    replies: dict[str, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)


class Soak:
    def __init__(self, endpoints: list[Endpoint], users: list[str]) -> None:
        self.endpoints = endpoints
        self.users = [SoakUser(u, i % len(endpoints)) for i, u in enumerate(users)]
        self.sent = 0
        self._ids = itertools.count(1)
        self._stop = asyncio.Event()
        self.reconnect_times: list[float] = []

    # -- connection --------------------------------------------------------------
    async def _connect(self, u: SoakUser) -> None:
        n = len(self.endpoints)
        for attempt in range(200):
            ep_i = (u.home + attempt) % n
            ep = self.endpoints[ep_i]
            if not ep.up:
                continue
            try:
                u.ws = await connect(f"ws://127.0.0.1:{ep.ws_port}/ws?token={token(u.name)}",
                                     open_timeout=3, close_timeout=1)
            except (OSError, InvalidHandshake, TimeoutError):
                await asyncio.sleep(0.1)
                continue
            u.at = ep_i
            asyncio.create_task(self._reader(u, u.ws))
            await self._sync(u)
            return
        raise RuntimeError(f"{u.name} found no node to connect to")

    async def _reader(self, u: SoakUser, ws: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for data in ws:
                f = orjson.loads(data)
                if f["op"] == "msg":
                    if f["to"] == u.name:
                        u.received.setdefault(f["mid"], "push")
                elif "re" in f and (fut := u.replies.pop(f["re"], None)) and not fut.done():
                    fut.set_result(f)

    async def _sync(self, u: SoakUser) -> None:
        ep = self.endpoints[u.at]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ep.http_port}", timeout=10,
                                     headers={"Authorization": f"Bearer {token(u.name)}"}) as h:
            for _ in range(1000):
                r = await h.get("/v1/sync", params={"since": u.cursor, "limit": 200})
                if r.status_code != 200:
                    u.errors[f"sync_{r.status_code}"] += 1
                    return
                page = r.json()
                for m in page["msgs"]:
                    if m["to"] == u.name:
                        u.received.setdefault(m["mid"], "sync")
                u.cursor = page["next"]
                if not page["more"]:
                    return

    # -- sending -----------------------------------------------------------------
    async def _send_once(self, u: SoakUser, to: str, cmid: str) -> dict[str, Any] | None:
        if u.ws is None:
            return None
        rid = f"s{next(self._ids)}"
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        u.replies[rid] = fut
        try:
            await u.ws.send(orjson.dumps({"op": "send", "id": rid, "to": to, "cmid": cmid,
                                          "body": {"c": cmid}}).decode())
            return await asyncio.wait_for(fut, 5)
        except (ConnectionClosed, TimeoutError):
            return None
        finally:
            u.replies.pop(rid, None)

    async def _send(self, u: SoakUser, to: str, cmid: str) -> None:
        self.sent += 1
        for _ in range(100):
            reply = await self._send_once(u, to, cmid)
            if reply is not None and reply["op"] == "ack":
                u.acked[cmid] = reply["mid"]
                return
            u.errors[reply["code"] if reply else "lost"] += 1
            if u.ws is None or u.ws.close_code is not None:
                t0 = asyncio.get_running_loop().time()
                u.reconnects += 1
                await self._connect(u)
                self.reconnect_times.append(asyncio.get_running_loop().time() - t0)
            else:
                await asyncio.sleep(0.2)

    async def _user_loop(self, u: SoakUser, peer: str, rate: float) -> None:
        for i in itertools.count():
            if self._stop.is_set():
                return
            await self._send(u, peer, f"{u.name}-{i}")
            await asyncio.sleep(1 / rate)

    async def run(self, seconds: float, rate: float, event: Any = None,
                  event_at: float = 0.0) -> None:
        for u in self.users:
            await self._connect(u)
        loops = [asyncio.create_task(self._user_loop(u, self.users[(i + 1) % len(self.users)]
                                                     .name, rate))
                 for i, u in enumerate(self.users)]
        if event is not None:
            await asyncio.sleep(event_at)
            await event()
            await asyncio.sleep(max(0.0, seconds - event_at))
        else:
            await asyncio.sleep(seconds)
        self._stop.set()
        await asyncio.wait_for(asyncio.gather(*loops), 120)

    async def finish(self) -> dict[str, Any]:
        """Final sync for everyone; returns the counts and what went missing."""
        for u in self.users:
            if u.ws is None or u.ws.close_code is not None or not self.endpoints[u.at].up:
                await self._connect(u)
            else:
                await self._sync(u)
        acked = {(self.users[(i + 1) % len(self.users)].name, mid)
                 for i, u in enumerate(self.users) for mid in u.acked.values()}
        received = {(u.name, mid) for u in self.users for mid in u.received}
        paths = Counter(p for u in self.users for p in u.received.values())
        for u in self.users:
            if u.ws is not None:
                await u.ws.close()
        return {
            "sent": self.sent, "acked": len(acked), "received": len(received),
            "missing": sorted(acked - received), "by_push": paths["push"],
            "by_sync": paths["sync"], "errors": sum((u.errors for u in self.users), Counter()),
            "reconnects": sum(u.reconnects for u in self.users),
            "unacked_received": len(received - acked),
        }
