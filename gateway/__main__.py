"""``python -m gateway serve`` runs a node; ``python -m gateway token USER`` prints a token."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from pathlib import Path

from gateway.auth import SecretError, issue_token, with_secret
from gateway.config import ConfigError, Settings
from gateway.node import Node, StartupError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("serve", help="run one gateway node (settings from IM_* variables)")
    tok = sub.add_parser("token", help="print a token for USER (development and tests)")
    tok.add_argument("user")
    tok.add_argument("--ttl", type=int, default=None,
                     help="seconds until it expires (default: a day, at most IM_AUTH_MAX_TTL_S)")
    args = parser.parse_args(argv)
    try:
        settings, secret_file = with_secret(Settings.from_env())
    except (ConfigError, SecretError) as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    if args.cmd == "token":
        if secret_file is not None:
            print(f"gateway: IM_AUTH_SECRET is unset; signing with the local secret in "
                  f"{secret_file}", file=sys.stderr)
        ttl = args.ttl if args.ttl is not None else min(86_400, settings.auth_max_ttl_s)
        try:
            print(issue_token(settings.auth_secret, args.user, ttl,
                              max_ttl_s=settings.auth_max_ttl_s))
        except ValueError as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 2
        return 0
    return serve(settings, secret_file)


def serve(settings: Settings, secret_file: Path | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if secret_file is not None:
        logging.getLogger("gateway").warning(
            "IM_AUTH_SECRET is unset: tokens are checked against the random secret in %s "
            "(this machine's nodes and `python -m gateway token` share it; set IM_AUTH_SECRET "
            "for nodes on several machines, and IM_ENV=production to require it)", secret_file)
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
    # testkit/nodes.py parses this line's start: keep its prefix as it is.
    metrics = (f" metrics http://{settings.metrics_host}:{node.metrics_port}/metrics"
               if node.metrics_port > 0 else "")
    print(f"gateway: node {node.name} ws://{settings.host}:{node.ws_port}/ws "
          f"http://{settings.host}:{node.http_port}{metrics}", flush=True)
    await stop.wait()
    await node.drain()
    return 0


if __name__ == "__main__":
    sys.exit(main())
