"""The ``Client``'s sends: ``send`` and ``group_send`` go into the ``Outbox`` of
the core (which decides what is due: a new send, a resend after a reconnect,
an ack timeout or an ``unavailable``), a ticker writes what is due on the
connection up, and each reply settles its send's future (an ``Ack``, or
``ServerError``). A mixin on ``Client``."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from imgate_client.connection import Connection, Disconnected
from imgate_client.core import Frame, Inbox, Outbox, Outcome
from imgate_client.errors import Ack, ClientStopped, SendTimeout, ServerError
from imgate_client.events import Stopped

__all__ = ["Sending"]


class Sending:
    """Durable sends over reconnects (see the module docstring)."""

    outbox: Outbox
    inbox: Inbox
    stopped: Stopped | None
    send_timeout: float
    _conn: Connection | None
    _ready: asyncio.Event
    _gen: int
    _waiters: dict[str, asyncio.Future[Ack]]
    _wake: asyncio.Event
    _run_task: asyncio.Task[None] | None

    def _on_send_reply(self, f: Frame) -> None:
        got = self.outbox.on_reply(f, asyncio.get_running_loop().time())
        if got is None:
            return
        p, outcome = got
        fut = self._waiters.get(p.cmid)
        if outcome is Outcome.RETRY:
            self._wake.set()
            return
        self._waiters.pop(p.cmid, None)
        if fut is None or fut.done():
            return
        if outcome is Outcome.ACKED:
            mid = int(f["mid"])
            self.inbox.fresh(mid)  # our own message: not delivered back by a sync
            seq = f.get("seq")
            fut.set_result(Ack(p.cmid, mid, int(f.get("ts", 0)),
                               seq if isinstance(seq, int) else None, p.attempts, f,
                               p.refusals, p.timeouts))
        else:
            fut.set_exception(ServerError(f))

    # -- the sends in flight ---------------------------------------------------------------
    async def _ticker(self) -> None:
        """Writes what the outbox says is due: new sends, resends after a reconnect, an
        ack timeout or an ``unavailable``."""
        loop = asyncio.get_running_loop()
        while self.stopped is None:
            self._wake.clear()
            conn = self._conn if self._ready.is_set() else None
            if conn is not None:
                await self._write_due(conn)
            deadline = self.outbox.next_deadline()
            wait = None if deadline is None else max(0.01, deadline - loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def _write_due(self, conn: Connection) -> None:
        loop = asyncio.get_running_loop()
        gen = self._gen
        while self._ready.is_set() and self._conn is conn:
            due = self.outbox.due(gen, loop.time())
            if not due:
                return
            for p in due:
                if p.cmid not in self.outbox:
                    continue
                try:
                    await conn.send(self.outbox.write(p, gen, loop.time()))
                except Disconnected:
                    return

    async def _submit(self, op: str, fields: dict[str, Any], cmid: str | None,
                      timeout: float | None) -> Ack:
        if self.stopped is not None:
            raise ClientStopped(self.stopped.reason)
        if self._run_task is None:
            raise RuntimeError("connect() first")
        loop = asyncio.get_running_loop()
        p = self.outbox.add(op, fields, cmid)
        fut: asyncio.Future[Ack] = loop.create_future()
        self._waiters[p.cmid] = fut
        conn = self._conn if self._ready.is_set() else None
        if conn is not None:
            with contextlib.suppress(Disconnected):
                await conn.send(self.outbox.write(p, self._gen, loop.time()))
        self._wake.set()
        try:
            async with asyncio.timeout(self.send_timeout if timeout is None else timeout):
                return await fut
        except TimeoutError:
            raise SendTimeout(p.cmid, p.attempts) from None
        finally:
            if not fut.done():
                fut.cancel()
            self._waiters.pop(p.cmid, None)
            self.outbox.remove(p.cmid)

    async def send(self, to: str, body: Any, *, cmid: str | None = None,
                   timeout: float | None = None, reply_to: int | None = None) -> Ack:
        """A 1:1 message; its ack once the node stored it. Written again with the same
        ``cmid`` after a reconnect, an ack timeout or ``unavailable``. ServerError if
        refused for good, SendTimeout after ``timeout`` (default ``send_timeout``).
        ``reply_to``: the mid of a message of this conversation it answers (another
        is ``bad_request``); stored with it (``Message.reply_to``)."""
        fields: dict[str, Any] = {"to": to, "body": body}
        if reply_to is not None:
            fields["reply_to"] = reply_to
        return await self._submit("send", fields, cmid, timeout)

    async def group_send(self, group: str, body: Any, *, cmid: str | None = None,
                         timeout: float | None = None, reply_to: int | None = None) -> Ack:
        """A group message (``Ack.seq``: its place in the group); as ``send``
        (``reply_to``: a mid of this group)."""
        fields: dict[str, Any] = {"group": group, "body": body}
        if reply_to is not None:
            fields["reply_to"] = reply_to
        return await self._submit("group_send", fields, cmid, timeout)
