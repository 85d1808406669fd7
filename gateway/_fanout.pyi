"""Types of the C fan-out loop (gateway/_fanout.c)."""

from collections.abc import Iterable
from typing import Any

def write_each(clients: Iterable[Any], data: bytes, limit: int, skip_conn: int,
               open_state: object, full: list[Any], unstuck: list[Any], /) -> int: ...
