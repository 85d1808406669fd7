"""The baseline servers of ``bench.room_bench`` and ``bench.conn_memory``, one per
process::

    python -m bench.room_baselines ws            # bare websockets + broadcast()
    python -m bench.room_baselines sio-aiohttp   # python-socketio on aiohttp
    python -m bench.room_baselines sio-asgi      # python-socketio ASGI app on uvicorn
    python -m bench.room_baselines idle          # bare websockets, idle connections

Each listens on a free port of 127.0.0.1, prints ``READY <url>`` on stdout, and
runs on uvloop until SIGTERM/SIGINT, EOF on stdin, or ``--max-seconds``.

- ``ws``: ``websockets.asyncio.server.serve`` (compression=None) speaking the
  subset of our node's protocol the benchmark uses. ``join`` adds the socket to
  the room's set and replies ``joined``; ``room_send`` parses the frame, builds
  one ``{"op":"room_msgs","room":..,"msgs":[{"from","body","ts"}]}`` frame (one
  message: no coalescing), calls ``websockets.broadcast(members, frame,
  text=True)`` and then replies ``{"op":"ok","re":id}`` to the publisher. The
  publisher is a member too, as on our node.
- ``sio-*``: ``socketio.AsyncServer`` with default settings (its own json module,
  websocket transport allowed directly). Event ``join`` ->
  ``await sio.enter_room(sid, room)`` and an ack; event ``room_send`` ->
  ``await sio.emit('m', {"from","body","ts"}, room=room)`` and an ack (the
  return value, sent as ``43<id>[true]``), so the publisher's closed loop is
  the same as for the other servers: the ack comes once the server has handed
  the message to every member (socket.io: queued for each member's writer task).
  aiohttp: ``web.AppRunner`` + ``TCPSite``, access log off. ASGI: uvicorn
  ``Server.serve`` with its default websocket implementation, per-message-deflate
  off, access log off.
- ``idle``: ``websockets.asyncio.server.serve`` with compression off and its
  default keepalive (ping every 20 s); the handler only awaits
  ``wait_closed()``: what an idle connection costs websockets and asyncio
  alone (the node adds its own per-connection state on top).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from bench.common import raise_fd_limit, run_loop, stdin_lines

MODES = ("ws", "sio-aiohttp", "sio-asgi", "idle")


def ready(url: str) -> None:
    print(f"READY {url}", flush=True)


# -- bare websockets ---------------------------------------------------------------------
async def run_ws(stop: asyncio.Event) -> None:
    from websockets.asyncio.server import ServerConnection, broadcast, serve
    from websockets.exceptions import ConnectionClosed

    rooms: dict[str, set[ServerConnection]] = defaultdict(set)

    async def handler(ws: ServerConnection) -> None:
        assert ws.request is not None
        user = parse_qs(urlsplit(ws.request.path).query).get("user", ["?"])[0]
        mine: set[str] = set()
        try:
            async for data in ws:
                f = orjson.loads(data)
                op, room = f.get("op"), f.get("room")
                if op == "room_send":
                    frame = orjson.dumps({"op": "room_msgs", "room": room, "msgs": [
                        {"from": user, "body": f["body"], "ts": int(time.time() * 1000)}]})
                    broadcast(rooms.get(room, ()), frame, text=True)
                    await ws.send(orjson.dumps({"op": "ok", "re": f.get("id")}), text=True)
                elif op == "join":
                    rooms[room].add(ws)
                    mine.add(room)
                    await ws.send(orjson.dumps({"op": "joined", "re": f.get("id"), "room": room,
                                                "online": len(rooms[room])}), text=True)
                else:
                    await ws.send(orjson.dumps({"op": "error", "re": f.get("id"),
                                                "code": "bad_request"}), text=True)
        except ConnectionClosed:
            pass
        finally:
            for room in mine:
                rooms[room].discard(ws)

    async with serve(handler, "127.0.0.1", 0, compression=None, max_size=1 << 20) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        ready(f"ws://127.0.0.1:{port}/")
        await stop.wait()


async def run_idle(stop: asyncio.Event) -> None:
    from websockets.asyncio.server import ServerConnection, serve

    async def handler(ws: ServerConnection) -> None:
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        ready(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/ws")
        await stop.wait()


# -- python-socketio -----------------------------------------------------------------------
def make_sio(async_mode: str) -> Any:
    import socketio  # type: ignore[import-not-found]  # the bench extra

    sio = socketio.AsyncServer(async_mode=async_mode, logger=False, engineio_logger=False)

    @sio.event
    async def join(sid: str, room: str) -> bool:
        await sio.enter_room(sid, room)
        return True

    @sio.event
    async def room_send(sid: str, data: dict[str, Any]) -> bool:
        await sio.emit("m", {"from": sid, "body": data["body"], "ts": int(time.time() * 1000)},
                       room=data["room"])
        return True

    return sio


async def run_sio_aiohttp(stop: asyncio.Event) -> None:
    from aiohttp import web  # type: ignore[import-not-found]  # the bench extra

    app = web.Application()
    make_sio("aiohttp").attach(app)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        ready(f"ws://127.0.0.1:{port}/socket.io/")
        await stop.wait()
    finally:
        await runner.cleanup()


async def run_sio_asgi(stop: asyncio.Event) -> None:
    import socketio  # type: ignore[import-not-found]  # the bench extra
    import uvicorn

    # uvicorn binds as `uvicorn.run` does with one process (asyncio then sets
    # TCP_NODELAY; on a socket from socket.create_server it would not, and
    # Nagle would hold its frames).
    config = uvicorn.Config(socketio.ASGIApp(make_sio("asgi")), host="127.0.0.1", port=0,
                            lifespan="off",
                            access_log=False, log_level="warning",
                            ws_per_message_deflate=False)
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[attr-defined]
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("uvicorn stopped before it started")
            await asyncio.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        ready(f"ws://127.0.0.1:{port}/socket.io/")
        await stop.wait()
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(task, 10)


# -- main ---------------------------------------------------------------------------------
async def serve_until_stopped(run: Callable[[asyncio.Event], Awaitable[None]],
                              max_seconds: float) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def stdin_eof() -> None:  # the benchmark went away: stop too
        async for _ in stdin_lines():
            pass
        stop.set()

    watch = asyncio.create_task(stdin_eof())
    loop.call_later(max_seconds, stop.set)
    try:
        await run(stop)
    finally:
        watch.cancel()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.room_baselines",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=MODES)
    p.add_argument("--max-seconds", type=float, default=3600)
    args = p.parse_args()
    raise_fd_limit()
    run = {"ws": run_ws, "sio-aiohttp": run_sio_aiohttp, "sio-asgi": run_sio_asgi,
           "idle": run_idle}[args.mode]
    run_loop(serve_until_stopped(run, args.max_seconds))


if __name__ == "__main__":
    main()
