"""What the ``Client`` raises, and a send's ``Ack``."""

from __future__ import annotations

from dataclasses import dataclass

from imgate_client.core import Frame, error_of

__all__ = ["Ack", "ClientStopped", "SendTimeout", "ServerError"]


class ServerError(Exception):
    """An ``error`` reply: ``code`` (bad_request, forbidden, not_found, ...) and message."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame
        self.code, self.message = error_of(frame) or ("internal", str(frame))
        super().__init__(f"{self.code}: {self.message}")


class ClientStopped(ConnectionError):
    """The client stopped (``close()``, close 4003, a 403 handshake, no valid token)."""


class SendTimeout(TimeoutError):
    """No ack within the send's timeout. The message may be stored: sending again
    with the same ``cmid`` is safe (the node answers the original mid)."""

    def __init__(self, cmid: str, attempts: int = 0) -> None:
        super().__init__(f"no ack for cmid {cmid}")
        self.cmid = cmid
        self.attempts = attempts  # frames written for it


@dataclass(frozen=True)
class Ack:
    """A send's ack: ``attempts`` is how many frames it took (more than 1 after a
    reconnect, an ``unavailable`` or an ack timeout); of those resends,
    ``refusals`` followed an ``unavailable`` / ``rate_limited`` answer and
    ``timeouts`` an ``ack_timeout`` without an answer (the rest: reconnects)."""

    cmid: str
    mid: int
    ts: int
    seq: int | None
    attempts: int
    frame: Frame
    refusals: int = 0
    timeouts: int = 0
