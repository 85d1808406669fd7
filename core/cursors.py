"""Sync cursors: where the next ``/v1/sync`` call starts. Pure logic.

Mids are issued before a message is stored, so two sends in flight can
become visible out of mid order: a page read now may lack a message whose
mid is lower than ones it holds. The cursor therefore never moves past the
*settle horizon* (the mid of "now minus the settle time"): entries newer
than that are returned, but returned again next time, and the client keeps
the first copy of each mid (delivery is at-least-once anyway).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["next_cursor"]


def next_cursor(since: int, page_mids: Sequence[int], more: bool, horizon: int) -> int:
    """Cursor after a page of ascending mids read from ``since``.

    A full page (``more``) always advances to its last mid, so a burst larger
    than one page inside the settle window cannot stall a client.
    """
    if not page_mids:
        return since
    if more:
        return page_mids[-1]
    settled = [m for m in page_mids if m <= horizon]
    return max(since, settled[-1]) if settled else since
