"""Connection ids that tell which run of a node took them.

A node restarted under the same name must not be taken for the run that died:
another node whose view still shows the old run's heartbeat lapsed would drop
pushes to the new run's devices and delete their routes. A connection id
carries the millisecond its node's hub started (high bits) above a counter
(low ``SHIFT`` bits), so a route can be dated against the last heartbeat seen
of its node. Pure: the caller gives the time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

__all__ = ["SHIFT", "conn_ids", "started_ms"]

SHIFT = 20  # a million connections per run before the counter reaches the next millisecond


def conn_ids(start_ms: int) -> Iterator[int]:
    """The ids of one run's connections: 1, 2, ... above ``start_ms``."""
    return itertools.count((start_ms << SHIFT) + 1)


def started_ms(conn: int) -> int:
    """When the run that took ``conn`` started (unix ms; 0 for ids of a node
    older than this scheme)."""
    return conn >> SHIFT
