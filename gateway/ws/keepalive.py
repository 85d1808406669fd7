"""Keepalive pings: one timer for the node, not a task and a timer per
connection (websockets' own keepalive: 20,000 idle connections cost 0.063
cores with it, 0.007 without).

Connections are spread over ``interval`` slots, one per second, round
robin; each second the next slot is visited. A visited connection whose
previous ping was not answered (no pong in a whole interval) is aborted: a
dead peer or a half-open TCP connection, which nothing else would notice.
The others get a ping, written straight to the socket as complete frame
bytes (``gateway.wire``) and registered with websockets as pending under a
shared, already resolved future: websockets drops the entry when the pong
arrives (``acknowledge_pings``), so the next visit sees it answered, with no
future, task or timer per connection. A connection whose write buffer is
backed up is not pinged that round (the socket writer owns slow readers).
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from collections.abc import Callable
from typing import Any

from gateway import wire
from gateway.hub import Client

__all__ = ["Keepalive"]

BACKED_UP = 64 * 1024  # bytes queued on a socket past which it is not pinged this round
_PAYLOAD = struct.Struct("!I")


class Keepalive:
    def __init__(self, interval_s: int, timed_out: Callable[[Client], None]) -> None:
        self.interval = max(1, interval_s)
        self.timed_out = timed_out
        self._slots: list[set[Client]] = [set() for _ in range(self.interval)]
        self._next_slot = itertools.cycle(range(self.interval))
        self._visit = 0
        self._ids = itertools.count(1)
        self._timer: asyncio.TimerHandle | None = None
        self._done: asyncio.Future[float] | None = None
        self.pings = 0  # pings written (tests, metrics)

    def __len__(self) -> int:
        return sum(len(s) for s in self._slots)

    def add(self, client: Client) -> None:
        slot = next(self._next_slot)
        client.ka_slot = slot
        self._slots[slot].add(client)
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._done = loop.create_future()
            self._done.set_result(0.0)
            self._timer = loop.call_later(1.0, self._tick)

    def discard(self, client: Client) -> None:
        if client.ka_slot >= 0:
            self._slots[client.ka_slot].discard(client)
            client.ka_slot = -1
        client.ka_ping = b""

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(1.0, self._tick)
        slot = self._slots[self._visit]
        self._visit = (self._visit + 1) % self.interval
        now = loop.time()
        for client in list(slot):
            self._check(client, now)

    def _check(self, client: Client, now: float) -> None:
        ws = client.ws
        if not wire.is_open(ws):
            return
        pending: dict[bytes, Any] = ws.pending_pings
        if client.ka_ping and client.ka_ping in pending:
            del pending[client.ka_ping]  # unanswered for a whole interval
            client.ka_ping = b""
            self.timed_out(client)
            return
        if wire.buffered(ws) > BACKED_UP:
            return
        payload = _PAYLOAD.pack(next(self._ids) & 0xFFFFFFFF)
        pending[payload] = (self._done, now)
        client.ka_ping = payload
        wire.write(ws, b"\x89\x04" + payload)  # a ping frame, FIN, 4 bytes of payload
        self.pings += 1
