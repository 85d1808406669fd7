"""Sync cursors: where the next ``/v1/sync`` call starts. Pure logic.

Mids are issued before a message is stored, so two sends in flight can
become visible out of mid order: a page read now may lack a message whose
mid is lower than ones it holds. The cursor therefore never moves past the
*settle horizon* (the mid of "now minus the settle time"): entries newer
than that are returned, but returned again next time, and the client keeps
the first copy of each mid (delivery is at-least-once anyway). Nor, even on
a full page, past the *bound*: just below the oldest mid a send on any node
may still store (``core.inflight``).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["next_cursor"]


def next_cursor(since: int, page_mids: Sequence[int], more: bool, horizon: int,
                bound: int | None = None) -> int:
    """Cursor after a page of ascending mids read from ``since``.

    A full page (``more``) advances to its last mid, so a burst larger than
    one page inside the settle window cannot stall a client; but never past
    ``bound``: a page holds what was stored when it was read, and a send still
    in flight below its last mid is not in it. A full page above ``bound``
    leaves the cursor at ``since`` (``more`` all the same): the client asks
    again later, once that send has landed or its mark has lapsed.
    """
    if bound is not None:
        page_mids = [m for m in page_mids if m <= bound]
        horizon = min(horizon, bound)
    if not page_mids:
        return since
    if more:
        return page_mids[-1]
    settled = [m for m in page_mids if m <= horizon]
    return max(since, settled[-1]) if settled else since
