"""The sans-I/O core of the imgate client: everything a client decides, with no
socket, no clock of its own and no event loop, so any transport can drive it
(the asyncio ``Client``, a gevent / websocket-client one, a lean load socket).

- ``frames``: encode / decode, request ids, cmids, token claims, close codes.
- ``outbox``: the in-flight send table (resend with the same cmid).
- ``inbox``: the sync cursor and paging, dedup by mid, ``recv_ack`` batching.
- ``rooms``: room positions, dedup by pos, the rejoin-with-``since`` recipe, gap
  recovery (a jump in ``pos`` or a ``room_gap``: rejoin ``since``, else ``RoomGap``).
- ``policy``: jittered backoff and what each close code means.
"""

from imgate_client.core.frames import (
    CLOSE_GOING_AWAY,
    CLOSE_NORMAL,
    CLOSE_STOPPED,
    CLOSE_TOKEN_EXPIRED,
    MESSAGE_OPS,
    MESSAGE_UPDATE_OPS,
    Frame,
    RequestIds,
    decode,
    encode,
    error_of,
    is_id,
    make,
    new_cmid,
    token_claims,
    token_expiry,
    token_user,
    with_token,
)
from imgate_client.core.inbox import AckBatcher, Inbox
from imgate_client.core.outbox import Outbox, Outcome, PendingSend
from imgate_client.core.policy import Action, Backoff, Decision, ReconnectPolicy
from imgate_client.core.rooms import Joined, RoomGap, RoomOut, Rooms, RoomState

__all__ = [
    "CLOSE_GOING_AWAY", "CLOSE_NORMAL", "CLOSE_STOPPED", "CLOSE_TOKEN_EXPIRED", "MESSAGE_OPS",
    "MESSAGE_UPDATE_OPS",
    "AckBatcher", "Action", "Backoff", "Decision", "Frame", "Inbox", "Joined", "Outbox",
    "Outcome", "PendingSend", "ReconnectPolicy", "RequestIds", "RoomGap", "RoomOut",
    "RoomState", "Rooms", "decode",
    "encode", "error_of", "is_id", "make", "new_cmid", "token_claims", "token_expiry",
    "token_user", "with_token",
]
