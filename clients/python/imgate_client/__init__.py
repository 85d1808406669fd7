"""imgate's Python client SDK.

- ``Client`` (``imgate_client.client``): the asyncio client that keeps a
  connection up: reconnects with jittered backoff, resends in-flight sends with
  the same cmid, syncs and dedups by mid, rejoins rooms with ``since``, renews
  its token, and obeys the node's close codes. Events go to ``on_event``
  (``imgate_client.events``; ``EventQueue`` for ``async for``).
- ``Connection`` (``imgate_client.connection``): one WebSocket, frame by frame:
  ``request`` (reply matched by id), pushes (callback or queue), raw sends.
- ``imgate_client.core``: the sans-I/O core both are built on, for any other
  transport (gevent, a lean load socket).
- ``HttpClient`` (``imgate_client.http``): the small HTTP/1.1 client of the API.
"""

from imgate_client.client import Ack, Client, ClientStopped, SendTimeout, ServerError
from imgate_client.connection import Connection, Disconnected, with_token
from imgate_client.core import Joined
from imgate_client.events import (
    Connected,
    ConnectionLost,
    Event,
    EventQueue,
    Message,
    Push,
    RoomGap,
    RoomMessages,
    RoomRejoined,
    Stopped,
    SyncFailed,
)
from imgate_client.http import HttpClient, HttpError
from imgate_client.ops import ConvSettings, ReactionUsers

__version__ = "0.1.0"

__all__ = [
    "Ack", "Client", "ClientStopped", "Connected", "Connection", "ConnectionLost",
    "ConvSettings", "Disconnected", "Event", "EventQueue", "HttpClient", "HttpError", "Joined",
    "Message", "Push", "ReactionUsers", "RoomGap", "RoomMessages", "RoomRejoined", "SendTimeout",
    "ServerError", "Stopped", "SyncFailed", "with_token",
]
