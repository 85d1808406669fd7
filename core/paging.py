"""Seek pagination, the one slicing rule every list read uses. Pure.

A reader asks its source for ``limit + 1`` items: the extra one says whether
another page follows, and the last item shown is the cursor of the next.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["seek_page"]

T = TypeVar("T")
C = TypeVar("C")


def seek_page(items: Sequence[T], limit: int, key: Callable[[T], C]
              ) -> tuple[list[T], C | None]:
    """(the first ``limit`` items, the next cursor or None on the last page)."""
    page = list(items[:limit])
    more = len(items) > limit
    return page, (key(page[-1]) if more and page else None)
