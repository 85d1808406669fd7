"""The feed's decisions: push a post or let readers pull it; merge a timeline page.

Posting (hybrid fan-out): an author with at most ``push_max`` followers has
each post pushed into every follower's timeline; a bigger author's posts are
pulled by readers. Comments are never pushed.

A timeline page (below the cursor) merges post ids from the reader's window
of pushed entries, posts pulled from authors, and posts whose fan-out is
under way. Every source is read newest first and cut at ``limit + 1`` (the
window at twice that), so the union's head is the true head. A window that
came back full only vouches for ids down to its last raw entry (the
``bound``): ids below it may be missing from it, so the page stops there and
the next page reads again from its cursor. Ids are time-ordered post ids,
so the cursor (the page's last id) is a seek key: the next page is below it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["TimelinePage", "merge_page", "should_push", "window_bound"]


@dataclass(frozen=True, slots=True)
class TimelinePage:
    """Post ids of one page, newest first; ``cursor`` is None on the last page."""

    ids: list[int]
    more: bool
    cursor: int | None


def should_push(followers: int, push_max: int, is_comment: bool) -> bool:
    """Push a post to its author's followers' timelines (else they pull it)."""
    return not is_comment and followers <= push_max


def window_bound(raw_len: int, asked: int, last_id: int | None) -> int | None:
    """The lowest id a window read vouches for, or None if it holds them all.

    A read of ``asked`` entries that came back full may have stopped short:
    it vouches only down to its last raw id (counting entries the reader
    filters out afterwards).
    """
    return last_id if raw_len == asked else None


def merge_page(
    window: set[int],
    pulled: set[int],
    in_flight: Iterable[int],
    bound: int | None,
    limit: int,
) -> TimelinePage:
    """One page from the sources' ids (each already below the cursor)."""
    newest_in_flight = sorted(in_flight, reverse=True)[: limit + 1]
    ids = sorted(window | pulled | set(newest_in_flight), reverse=True)
    if bound is not None:
        ids = [i for i in ids if i >= bound]
    more = len(ids) > limit or bound is not None
    ids = ids[:limit]
    cursor = (ids[-1] if ids else bound) if more else None
    return TimelinePage(ids, more, cursor)
