"""Group seqs for a batch of sends, and what the batch changes in group state.

A batch of group sends is split by group; each group's counter is raised
once by the number of its items (one ``$inc`` per group per batch), and the
new end ``E`` hands the group's ``n`` items the seqs ``E-n+1 .. E`` in
arrival order. Once stored, a batch moves each group's newest message, its
newest read-diffused mid, and each sender's read seq (a sender's own
messages are never unread to it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

__all__ = ["BatchSummary", "SeqMessage", "assign", "by_group", "summarize"]


class SeqMessage(Protocol):
    """A stored group message, as far as the batch summary needs it."""

    @property
    def group(self) -> str: ...

    @property
    def seq(self) -> int: ...

    @property
    def mid(self) -> int: ...

    @property
    def sender(self) -> str: ...

    @property
    def wd(self) -> bool: ...  # write-diffused: also in every member's box


M = TypeVar("M", bound=SeqMessage)


@dataclass(frozen=True, slots=True)
class BatchSummary(Generic[M]):
    """What a stored batch changes in the groups' state.

    ``newest``: per group, the message with the highest seq. ``rdmid``: per
    group of the batch, the highest mid of its read-diffused messages, 0 when
    it has none. ``reads``: (sender, group, highest own seq), in order of
    first appearance.
    """

    newest: dict[str, M]
    rdmid: dict[str, int]
    reads: list[tuple[str, str, int]]


def by_group(groups: Sequence[str]) -> dict[str, list[int]]:
    """Item indexes per group, in arrival order (groups in first-seen order)."""
    out: dict[str, list[int]] = {}
    for i, group in enumerate(groups):
        out.setdefault(group, []).append(i)
    return out


def assign(indexes: list[int], end: int) -> list[tuple[int, int]]:
    """(item index, seq) for one group whose counter now ends at ``end``."""
    first = end - len(indexes) + 1
    return [(i, first + k) for k, i in enumerate(indexes)]


def summarize(msgs: Iterable[M]) -> BatchSummary[M]:
    """The batch's effect on group state (see ``BatchSummary``)."""
    newest: dict[str, M] = {}
    rdmid: dict[str, int] = {}
    own: dict[tuple[str, str], int] = {}
    for m in msgs:
        if m.group not in newest or m.seq > newest[m.group].seq:
            newest[m.group] = m  # on equal seqs the first one stays
        floor = rdmid.get(m.group, 0)
        rdmid[m.group] = floor if m.wd else max(floor, m.mid)
        key = (m.sender, m.group)
        own[key] = max(own.get(key, 0), m.seq)
    reads = [(user, group, seq) for (user, group), seq in own.items()]
    return BatchSummary(newest, rdmid, reads)
