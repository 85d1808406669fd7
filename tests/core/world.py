"""The chat side of a node built from fakes, exactly as ``gateway.app.compose``
builds it from the real stores: claims, 1:1 chat, groups (with their write
diffusion and their administration) and the conversations facade. No servers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from core.ids import MidGenerator
from gateway.chat.claims import Claims
from gateway.chat.service import ChatLimits, ChatService
from gateway.config import Settings
from gateway.groups.admin import AdminLimits, GroupAdmin
from gateway.groups.diffusion import GroupDiffusion
from gateway.groups.service import GroupLimits, GroupService
from gateway.inbox.conversations import Conversations
from gateway.metrics import NodeMetrics
from tests.core.fakes import FakeDedup, FakeMessages, FakeOffline, FakeQuotas, FakeRoutes
from tests.core.fakes_groups import FakeControl, FakeGroupCache, FakeGroupStore

__all__ = ["FakeStores", "World", "build"]


@dataclass
class FakeStores:
    """One node's stores, as fakes sharing state where the real ones share keys."""

    dedup: FakeDedup = field(default_factory=FakeDedup)
    routes: FakeRoutes = field(default_factory=FakeRoutes)
    messages: FakeMessages = field(default_factory=FakeMessages)
    groups: FakeGroupStore = field(default_factory=FakeGroupStore)
    group_cache: FakeGroupCache = field(default_factory=FakeGroupCache)
    quotas: FakeQuotas = field(default_factory=lambda: FakeQuotas())
    refusals: list[str] = field(default_factory=list)  # caps refused, by name
    offline: FakeOffline = field(init=False)

    def __post_init__(self) -> None:
        self.offline = FakeOffline(self.dedup, self.routes)
        self.group_cache.store = self.groups


@dataclass
class World:
    stores: FakeStores
    claims: Claims
    chat: ChatService
    groups: GroupService
    admin: GroupAdmin
    control: FakeControl
    conversations: Conversations

    async def close(self) -> None:
        await self.claims.close()
        await self.chat.close()
        await self.groups.close()


def build(settings: Settings | None = None, *, node: int = 1,
          clock_ms: Callable[[], int] | None = None) -> World:
    """The services over fresh fakes (``clock_ms``: the mid generator's clock)."""
    s = settings or Settings()
    f = FakeStores()
    metrics = NodeMetrics()
    batch = {"max_batch": s.batch_max, "max_pending": s.pending_max}
    mids = MidGenerator(node, clock_ms)
    claims = Claims(f.dedup, observe=metrics.stage_observer("dedup"), **batch)
    chat = ChatService(claims, f.messages, f.offline, f.routes, mids, ChatLimits.from_settings(s),
                       metrics)
    diffusion = GroupDiffusion(f.group_cache, f.messages, f.offline)
    control = FakeControl()
    groups = GroupService(f.groups, f.group_cache, claims, mids, diffusion, f.offline,
                          GroupLimits.from_settings(s), metrics)
    admin = GroupAdmin(f.groups, f.group_cache, control, AdminLimits.from_settings(s),
                       f.quotas, refused=f.refusals.append)
    conversations = Conversations(chat, groups, s.sync_settle_ms)
    return World(f, claims, chat, groups, admin, control, conversations)
