"""``python -m gateway serve`` runs a node; ``python -m gateway token USER`` prints a token."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys

from gateway.auth import issue_token
from gateway.config import ConfigError, Settings
from gateway.node import Node, StartupError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("serve", help="run one gateway node (settings from IM_* variables)")
    tok = sub.add_parser("token", help="print a token for USER (development and tests)")
    tok.add_argument("user")
    tok.add_argument("--ttl", type=int, default=86_400, help="seconds until it expires")
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    if args.cmd == "token":
        try:
            print(issue_token(settings.auth_secret, args.user, args.ttl))
        except ValueError as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 2
        return 0
    return serve(settings)


def serve(settings: Settings) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # A line per connection opened and closed costs CPU and disk at 10k connections.
    logging.getLogger("websockets.server").setLevel(logging.WARNING)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        return asyncio.run(_serve(settings))
    return uvloop.run(_serve(settings))


async def _serve(settings: Settings) -> int:
    node = Node(settings)
    try:
        await node.start()
    except StartupError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Everything allocated at start-up lives as long as the process: keep it out of
    # the collector's generations, and collect the young generation less often.
    # Full collections over a big heap stalled every connection ~50 ms (measured).
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    print(f"gateway: node {node.name} ws://{settings.host}:{node.ws_port}/ws "
          f"http://{settings.host}:{node.http_port}", flush=True)
    await stop.wait()
    await node.drain()
    return 0


if __name__ == "__main__":
    sys.exit(main())
