"""Dedup claims on (sender, cmid), batched: one Redis round trip for every
send in flight, 1:1 and group alike (``core.dedup`` reads the values)."""

from __future__ import annotations

from core import dedup
from core.batcher import Batcher, Observe
from store.ports import DedupStore

__all__ = ["Claims"]

Claim = tuple[str, str, int]


class Claims:
    def __init__(self, store: DedupStore, *, max_batch: int, max_pending: int,
                 observe: Observe | None = None) -> None:
        self.store = store
        self._batcher: Batcher[Claim, str | None] = Batcher(
            self._flush, name="redis", max_batch=max_batch, max_pending=max_pending,
            observe=observe)

    async def claim(self, sender: str, cmid: str, mid: int) -> dedup.Prior | None:
        """None if (sender, cmid) is new (now pending under ``mid``), else what
        it was claimed as earlier."""
        value = await self._batcher.submit((sender, cmid, mid))
        return None if value is None else dedup.parse(value)

    async def _flush(self, claims: list[Claim]) -> list[str | None]:
        return await self.store.claim(claims)

    async def close(self) -> None:
        await self._batcher.close()
