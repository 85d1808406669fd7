"""Who has read a group message: computed from the members' read seqs when
asked (O(members) on read), never counted on send (O(1) per message). Pure.

A message with seq ``s`` counts for the members who could see it: those who
joined before it (``from_seq < s``), its sender left out (its own messages
are read by definition). Such a member has read it once its read seq
reached ``s``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ReadStatus", "read_status"]


@dataclass(frozen=True, slots=True)
class ReadStatus:
    readers: list[str]  # in id order
    unread: int

    @property
    def read(self) -> int:
        return len(self.readers)


def read_status(seq: int, sender: str,
                members: Iterable[tuple[str, int, int]]) -> ReadStatus:
    """``members``: (user, from seq, read seq) of each current member."""
    readers: list[str] = []
    unread = 0
    for user, from_seq, read_seq in members:
        if user == sender or from_seq >= seq:
            continue
        if read_seq >= seq:
            readers.append(user)
        else:
            unread += 1
    return ReadStatus(sorted(readers), unread)
