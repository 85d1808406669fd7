"""Group chat: membership, the send path with per-group seq, unread, reads.

Send: member? -> dedup on (sender, cmid) -> mid -> (batched) seqs from the
group's counter in MongoDB (one ``$inc`` per group per batch) -> one copy of
each message in ``group_msgs`` -> small groups (at most
``IM_GROUP_WRITE_DIFFUSION_MAX`` members) also get a box entry and an offline
entry per member (write diffusion); bigger ones nothing more (members read
the group by mid: read diffusion) -> the group's state in Redis -> ``ack``
with ``seq`` -> one push envelope per node holding members.

Unread of a group = its seq - the member's read seq: a message costs the
same O(1) counter work whatever the member count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from core.batcher import Batcher
from core.ids import mid_time_ms
from gateway.errors import ProtocolError
from gateway.grouphub import GroupHub, group_key
from gateway.hub import Client
from gateway.protocol import encode
from router.errors import BrokerUnavailable
from store.errors import Unavailable
from store.groups import GroupMessage, group_frame
from store.inbox import Delivery
from store.messages import box_id

if TYPE_CHECKING:
    from gateway.node import Node

__all__ = ["GroupSendResult", "GroupService"]

log = logging.getLogger("gateway.groups")


@dataclass(frozen=True, slots=True)
class GroupSendResult:
    mid: int
    seq: int
    ts: int
    frame: bytes | None  # None for a duplicate: nothing new to push


@dataclass(frozen=True, slots=True)
class _Pending:
    group: str
    sender: str
    cmid: str
    body: Any
    mid: int


class GroupService:
    """Groups for one node; knows sockets only through the group hub."""

    def __init__(self, node: Node, ghub: GroupHub) -> None:
        self.node = node
        self.settings = node.settings
        self.stores = node.stores
        self.cache = node.stores.group_cache
        self.ghub = ghub
        s = self.settings
        self._writes: Batcher[_Pending, GroupMessage] = Batcher(
            self._flush, name="mongo", max_batch=s.batch_max, max_pending=s.pending_max,
            linger_s=s.mongo_linger_ms / 1000, observe=node.metrics.stage_observer("group"))
        self._repairs: set[asyncio.Task[None]] = set()
        # Connects load memberships in batches: a reconnect storm is a few round trips.
        self._loads: Batcher[str, list[str]] = Batcher(
            self.cache.groups_of, name="redis", max_batch=s.batch_max,
            max_pending=s.pending_max)

    # -- membership (HTTP) -----------------------------------------------------
    async def create(self, owner: str, name: str, members: list[str]) -> str:
        users = list(dict.fromkeys([owner, *members]))
        self._check_size(len(users))
        group = secrets.token_hex(8)
        await self.stores.groups.create(group, name, owner, users)
        await self.cache.added(group, users, 0, complete=True)
        await self.cache.created(group)
        await self._notify(users, {"op": "gadd", "g": group})
        return group

    async def add(self, caller: str, group: str, users: list[str]) -> None:
        doc = await self._owned(caller, group)
        self._check_size(int(doc.get("size", 0)) + len(users))
        added, seq = await self.stores.groups.add_members(group, list(dict.fromkeys(users)))
        if added:
            await self.cache.added(group, added, seq)
            await self._notify(added, {"op": "gadd", "g": group})

    async def remove(self, caller: str, group: str, user: str) -> None:
        doc = await self._owned(caller, group)
        if user == doc["owner"]:
            raise ProtocolError("bad_request", "the owner cannot be removed")
        if await self.stores.groups.remove_member(group, user):
            await self.cache.removed(group, user)
            await self._notify([user], {"op": "gdel", "g": group})

    def _check_size(self, n: int) -> None:
        if n > self.settings.group_max_members:
            raise ProtocolError("bad_request", f"a group has at most "
                                f"{self.settings.group_max_members} members")

    async def _owned(self, caller: str, group: str) -> dict[str, Any]:
        doc = await self.stores.groups.get(group)
        if doc is None:
            raise ProtocolError("not_found", "no such group")
        if doc["owner"] != caller:
            raise ProtocolError("forbidden", "only the group's owner may change its members")
        return doc

    async def _notify(self, users: list[str], ctl: dict[str, Any]) -> None:
        """Apply a membership change to the users' connected devices on every node
        before answering, so no push sent after the answer misses it."""
        routes = await self.node.routes.lookup(users)
        remote: dict[str, list[str]] = {}
        for user, r in zip(users, routes, strict=True):
            for node in set(r.values()):
                if node != self.node.name and self.node.router.is_alive(node, time.time()):
                    remote.setdefault(node, []).append(user)
        await self.apply_control(users, ctl)
        for node, on_node in remote.items():
            with contextlib.suppress(BrokerUnavailable):  # a dead node: nothing to tell
                await self.node.router.control(node, on_node, ctl)

    # -- connections and controls ------------------------------------------------
    async def connected(self, client: Client) -> None:
        try:
            groups = await self._loads.submit(client.user)
        except Unavailable as exc:  # pushes of groups wait for a reconnect; sync has it all
            log.warning("groups of %s not loaded: %s", client.user, exc)
            return
        if groups:
            await self._join(client, groups)

    async def _join(self, client: Client, groups: list[str]) -> None:
        for g in groups:
            self.ghub.add(client, g)
        # ensure() is cheap when bound, and also cancels a pending lazy unbind.
        await asyncio.gather(*(self.node.bindings.ensure(group_key(g)) for g in groups))

    def disconnected(self, client: Client) -> None:
        now = time.monotonic()
        for g in self.ghub.remove_all(client):
            self.node.bindings.idle(group_key(g), now)

    async def apply_control(self, users: list[str], ctl: dict[str, Any]) -> None:
        group, op = ctl.get("g"), ctl.get("op")
        if not isinstance(group, str):
            return
        for user in users:
            for client in self.ghub.user_devices(user):
                if op == "gadd":
                    await self._join(client, [group])
                elif op == "gdel" and self.ghub.remove(client, group):
                    self.node.bindings.idle(group_key(group), time.monotonic())

    # -- send ----------------------------------------------------------------------
    async def send(self, sender: str, group: str, cmid: str, body: Any) -> GroupSendResult:
        if not await self.cache.is_member(group, sender):
            raise ProtocolError("forbidden", "not a member of this group")
        mid = self.node.chat.mids.next()
        prior = await self.node.chat.claim(sender, cmid, mid)
        if prior is not None:
            state, _, rest = prior.partition(":")
            old_mid, _, old_seq = rest.partition(":")
            if state == "d" and old_seq:
                return GroupSendResult(int(old_mid), int(old_seq), mid_time_ms(int(old_mid)),
                                       None)
            if state == "d":
                raise ProtocolError("bad_request", "cmid was used for a 1:1 message")
            mid = int(old_mid)
        m = await self._writes.submit(_Pending(group, sender, cmid, body, mid))
        return GroupSendResult(m.mid, m.seq, mid_time_ms(m.mid), encode(group_frame(m)))

    async def _flush(self, items: list[_Pending]) -> list[GroupMessage | BaseException]:
        s = self.stores
        by_group: dict[str, list[int]] = {}
        for i, it in enumerate(items):
            by_group.setdefault(it.group, []).append(i)
        sizes = await self.cache.sizes(by_group)
        small = {g for g, n in sizes.items() if n <= self.settings.group_write_diffusion_max}
        ends = await asyncio.gather(*(
            s.groups.allocate(g, len(idx), max(items[i].mid for i in idx),
                              0 if g in small else max(items[i].mid for i in idx))
            for g, idx in by_group.items()), return_exceptions=True)
        out: list[GroupMessage | BaseException] = [Unavailable("mongo")] * len(items)
        allocated: list[GroupMessage] = []
        where: list[int] = []
        for (g, idx), end in zip(by_group.items(), ends, strict=True):
            for k, i in enumerate(idx):
                if isinstance(end, BaseException):
                    out[i] = end
                    continue
                it = items[i]
                allocated.append(GroupMessage(g, end - len(idx) + k + 1, it.mid, it.sender,
                                              it.cmid, it.body, g in small))
                where.append(i)
        if not allocated:
            return out
        try:
            stored = await s.groups.insert(allocated)
        except Unavailable:
            self._repair(allocated)  # their seqs get tombstones once MongoDB is back
            raise
        for i, m in zip(where, stored, strict=True):
            out[i] = m
        ok = [m for m in stored if isinstance(m, GroupMessage)]
        await self._diffuse([m for m in ok if m.wd])
        await self._record(ok)
        return out

    async def _diffuse(self, msgs: list[GroupMessage]) -> None:
        """Write diffusion: a box entry and an offline entry per member."""
        if not msgs:
            return
        members = await self.cache.members({m.group for m in msgs})
        boxes: list[dict[str, Any]] = []
        deliveries: list[Delivery] = []
        for m in msgs:
            frame = encode(group_frame(m))
            conv = f"g:{m.group}"
            for u in members[m.group]:
                boxes.append({"_id": box_id(u, m.mid), "owner": u, "conv": conv,
                              "mid": m.mid, "out": u == m.sender})
                deliveries.append(Delivery(u, conv, m.mid, frame, unread=False,
                                           conv_list=False))
        await self.stores.messages.insert_boxes(boxes)
        await self.stores.inbox.deliver(deliveries, [], routes=False)

    async def _record(self, msgs: list[GroupMessage]) -> None:
        """The groups' state in Redis, the senders' read seqs (their own messages
        are not unread to them), then the senders' dedup keys (acked)."""
        newest: dict[str, GroupMessage] = {}
        rd: dict[str, int] = {}
        for m in msgs:
            if m.group not in newest or m.seq > newest[m.group].seq:
                newest[m.group] = m
            if not m.wd:
                rd[m.group] = max(rd.get(m.group, 0), m.mid)
        own: dict[tuple[str, str], int] = {}
        for m in msgs:
            own[(m.sender, m.group)] = max(own.get((m.sender, m.group), 0), m.seq)
        reads = [(u, g, seq) for (u, g), seq in own.items()]
        await self.cache.record([(g, m.seq, m.mid, encode(group_frame(m)), rd.get(g, 0))
                                 for g, m in newest.items()], reads)
        self._later(self.stores.groups.set_reads(reads))  # only Redis' rebuild needs it
        await self.stores.inbox.deliver([], [(m.sender, m.cmid, f"{m.mid}:{m.seq}")
                                             for m in msgs], routes=False)

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        """Durable copies nobody waits for. Bounded: past 1,000 pending the write
        is skipped (a later send of the same member carries a higher read seq)."""
        async def run() -> None:
            try:
                await work
            except Unavailable as exc:
                log.warning("deferred group write failed: %s", exc)

        if len(self._repairs) > 1000:
            work.close()
            return
        task = asyncio.create_task(run())
        self._repairs.add(task)
        task.add_done_callback(self._repairs.discard)

    def _repair(self, msgs: list[GroupMessage]) -> None:
        async def fill() -> None:
            for _ in range(300):
                try:
                    await self.stores.groups.fill(msgs)
                    return
                except Unavailable:
                    await asyncio.sleep(1.0)
            log.error("seqs %s stay unfilled", [(m.group, m.seq) for m in msgs][:10])

        task = asyncio.create_task(fill())
        self._repairs.add(task)
        task.add_done_callback(self._repairs.discard)

    async def close(self) -> None:
        await self._writes.close()
        await self._loads.close()
        if self._repairs:
            await asyncio.wait(self._repairs, timeout=5)

    # -- reading ---------------------------------------------------------------------
    async def _membership(self, user: str, group: str) -> tuple[int, int]:
        mine = (await self.cache.user_groups(user)).get(group)
        if mine is None:
            raise ProtocolError("forbidden", "not a member of this group")
        return mine.from_seq, mine.read_seq

    async def read(self, user: str, group: str, mid: int) -> int:
        """Read up to ``mid``; returns the group's unread count after it."""
        from_seq, _ = await self._membership(user, group)
        seq = await self.stores.groups.seq_of(group, mid)
        if seq is None:
            raise ProtocolError("not_found", "no such message in this group")
        read = await self.cache.set_read(user, group, max(seq, from_seq))
        if read is None:
            raise ProtocolError("forbidden", "not a member of this group")
        await self.stores.groups.set_read(group, user, read)
        state = (await self.cache.states([group]))[group]
        return max(0, state.seq - read)

    async def history(self, user: str, group: str, before: int | None, limit: int
                      ) -> tuple[list[dict[str, Any]], int | None]:
        from_seq, _ = await self._membership(user, group)
        frames = await self.stores.groups.page(group, from_seq=from_seq, before=before,
                                               limit=limit + 1)
        more = len(frames) > limit
        frames = frames[:limit]
        return frames, (frames[-1]["mid"] if more else None)

    async def sync_rd(self, user: str, since: int, limit: int) -> list[dict[str, Any]]:
        """Read-diffused group messages after ``since`` (write-diffused ones are in
        the user's own offline store and box), oldest first, at most ``limit``."""
        mine = await self.cache.user_groups(user)
        if not mine:
            return []
        states = await self.cache.states(mine)
        busy = [g for g, st in states.items() if st.rdmid > since]
        pages = await asyncio.gather(*(
            self.stores.groups.page(g, from_seq=mine[g].from_seq, after=since, limit=limit,
                                    only_rd=True) for g in busy))
        merged = sorted((f for p in pages for f in p), key=lambda f: f["mid"])
        return merged[:limit]

    async def conversation_rows(self, user: str) -> tuple[int, list[tuple[int, dict[str, Any]]]]:
        """(total unread over the user's groups, [(last mid, row)])."""
        mine = await self.cache.user_groups(user)
        if not mine:
            return 0, []
        states = await self.cache.states(mine)
        total = 0
        rows: list[tuple[int, dict[str, Any]]] = []
        for g, st in states.items():
            unread = max(0, st.seq - max(mine[g].read_seq, mine[g].from_seq))
            total += unread
            last = orjson.Fragment(st.last) if st.last and st.seq > mine[g].from_seq else None
            rows.append((st.lastmid if last is not None else 0,
                         {"conv": f"g:{g}", "unread": unread, "last": last}))
        return total, rows
