"""The dedup value stored per (sender, cmid): one format, written and read here.

A send first claims its (sender, cmid) with ``p:<mid>`` (in flight, or failed
part-way: a retry redoes it under the same mid, every write being
idempotent). Once acked the value becomes ``d:<mid>`` for a 1:1 message or
``d:<mid>:<seq>`` for a group message, and a resend is answered from it
without storing anything. The pending form does not say which kind of send
claimed it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Prior", "done", "parse", "pending"]

_PENDING = "p"
_DONE = "d"


@dataclass(frozen=True, slots=True)
class Prior:
    """What an earlier send with the same (sender, cmid) left behind.

    ``acked`` False: in flight or failed, reuse ``mid``. ``acked`` True: answer
    with ``mid`` (and ``seq``, which is set for a group message and None for
    a 1:1 message).
    """

    acked: bool
    mid: int
    seq: int | None = None


def pending(mid: int) -> str:
    """The claim of a send in flight under ``mid``."""
    return f"{_PENDING}:{mid}"


def done(mid: int, seq: int | None = None) -> str:
    """The value of an acked send: 1:1 without ``seq``, group with it."""
    return f"{_DONE}:{mid}" if seq is None else f"{_DONE}:{mid}:{seq}"


def parse(value: str) -> Prior:
    """Read a stored value; ``ValueError`` if it is none of the three forms."""
    state, *numbers = value.split(":")
    if state == _PENDING and len(numbers) == 1:
        return Prior(False, _number(numbers[0], value))
    if state == _DONE and len(numbers) == 1:
        return Prior(True, _number(numbers[0], value))
    if state == _DONE and len(numbers) == 2:
        return Prior(True, _number(numbers[0], value), _number(numbers[1], value))
    raise ValueError(f"malformed dedup value {value[:40]!r}")


def _number(text: str, value: str) -> int:
    # Plain ASCII digits only: int() would also take " 7", "+7" and "1_0".
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"malformed dedup value {value[:40]!r}")
    return int(text)
