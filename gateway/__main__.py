"""``python -m gateway serve`` runs a node; ``python -m gateway config`` prints and checks
the settings; ``python -m gateway token USER`` prints a token; ``python -m gateway
events --webhook URL`` relays events to a webhook (``relay.webhook``)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from pathlib import Path

from gateway.auth import SecretError, issue_token, with_secret
from gateway.cli import settings as config_cli
from gateway.cli.workers import supervise
from gateway.config import ConfigError, Settings, parse_workers
from gateway.node import Node, StartupError
from relay import webhook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway")
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve_p = sub.add_parser(
        "serve", help="run one gateway node (settings from IM_* variables)",
        description="Run one gateway node: WebSocket /ws and the HTTP API (with the demo "
        "at /demo/). Ctrl-C or SIGTERM drains it.",
        epilog=config_cli.settings_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    serve_p.add_argument("--workers", metavar="N",
                         help="node processes on this host sharing its ports (auto: one per "
                         "core); wins over IM_WORKERS")
    conf = sub.add_parser(
        "config", help="print the effective settings (secrets masked) and check them",
        description="Print each IM_* setting as the node would use it, and where it came "
        "from; exit 2 with one line per problem on standard error if any.")
    what = conf.add_mutually_exclusive_group()
    what.add_argument("--example", action="store_true",
                      help="print an env file with every setting at its default, commented")
    what.add_argument("--markdown", action="store_true",
                      help="print the settings as a markdown table (README's)")
    tok = sub.add_parser("token", help="print a token for USER (development and tests)")
    tok.add_argument("user")
    tok.add_argument("--device", help="a device claim: the login policy's device id "
                     "(wins over the handshake's ?device=)")
    tok.add_argument("--platform", choices=("ios", "android", "web", "desktop", "other"),
                     help="a platform claim (wins over the handshake's ?platform=)")
    for p in (serve_p, conf, tok):
        p.add_argument("--env-file", metavar="FILE",
                       help="NAME=value lines read before the environment (which wins)")
    tok.add_argument("--ttl", type=int, default=None,
                     help="seconds until it expires (default: a day, at most IM_AUTH_MAX_TTL_S)")
    _events_arguments(sub.add_parser(
        "events", help="relay {IM_NAMESPACE}.events to a webhook (secret: IM_WEBHOOK_SECRET)"))
    args = parser.parse_args(argv)
    if args.cmd == "config":
        return config(args)
    if args.cmd == "events":  # needs no token secret: none of the nodes' settings but two
        try:
            nodes = Settings.from_env({k: v for k, v in os.environ.items()
                                       if k in ("IM_NAMESPACE", "IM_AMQP_URL")})
        except ConfigError as exc:
            print(f"gateway: events: {exc}", file=sys.stderr)
            return 2
        return webhook.main(args, os.environ, namespace=nodes.namespace,
                            amqp_url=nodes.amqp_url)
    try:
        env = {**config_cli.read_env_file(args.env_file), **os.environ} if args.env_file \
            else dict(os.environ)
        for name in config_cli.unknown_names(env):
            print(f"gateway: warning: {name} is not a setting (ignored; "
                  "`python -m gateway serve --help` lists them)", file=sys.stderr)
        settings, secret_file = with_secret(Settings.from_env(env))
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
                              max_ttl_s=settings.auth_max_ttl_s, device=args.device,
                              platform=args.platform))
        except ValueError as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.workers is not None:
        env["IM_WORKERS"] = args.workers
    try:
        workers = parse_workers(env.get("IM_WORKERS", settings.workers))
    except ValueError as exc:
        print(f"gateway: IM_WORKERS / --workers: {exc}", file=sys.stderr)
        return 2
    if workers > 1:
        if settings.node_id >= 0:
            print("gateway: IM_NODE_ID cannot be set with more than one worker (each worker "
                  "leases its own)", file=sys.stderr)
            return 2
        return supervise(workers, env, settings.host, settings.ws_port, settings.http_port,
                         settings.metrics_host, settings.metrics_port)
    return serve(settings, secret_file)


def config(args: argparse.Namespace) -> int:
    if args.example:
        print(config_cli.example_env())
        return 0
    if args.markdown:
        print(config_cli.markdown_table())
        return 0
    try:
        file_env = config_cli.read_env_file(args.env_file) if args.env_file else {}
    except ConfigError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    checked = config_cli.check(dict(os.environ), file_env)
    if checked.settings is None:
        for problem in checked.problems:
            print(f"gateway: {problem}", file=sys.stderr)
        return 2
    for line in config_cli.render(checked.settings, checked.sources):
        print(line)
    if not checked.settings.auth_secret:
        print("# IM_AUTH_SECRET is unset: `serve` signs and checks tokens with a random "
              "secret kept in IM_AUTH_SECRET_FILE (refused with IM_ENV=production)")
    return 0


def _events_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--webhook", metavar="URL", help="http(s) URL to POST to (required to relay)")
    p.add_argument("--delete-queue", action="store_true",
                   help="remove the relay's queue and its .dead (the events in them are lost), "
                   "then exit")
    p.add_argument("--queue", help="the relay's durable queue (default: {IM_NAMESPACE}.webhook)")
    p.add_argument("--bind", action="append", metavar="PATTERN",
                   help="binding pattern on {IM_NAMESPACE}.events, repeatable (default: #)")
    p.add_argument("--secret-file", metavar="PATH", help="HMAC secret (else IM_WEBHOOK_SECRET), "
                   f"at least {webhook.MIN_SECRET} bytes")
    for name, kind, default, what in (
            ("--max-attempts", int, 10, "attempts before an event is dead-lettered"),
            ("--max-delay", float, 30.0, "seconds between two attempts, at most"),
            ("--timeout", float, 10.0, "seconds an HTTP attempt may take"),
            ("--prefetch", int, 64, "deliveries RabbitMQ hands over ahead"),
            ("--summary-every", float, 60.0, "seconds between summary lines"),
            ("--max-length", int, 100_000, "events the queue holds; past it the oldest is "
             "dropped"),
            ("--max-age", float, 7 * 86_400.0, "an event older than this is dropped")):
        p.add_argument(name, type=kind, default=default, metavar="N" if kind is int else "SECONDS",
                       help=f"{what} (default: {default})")


def serve(settings: Settings, secret_file: Path | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if secret_file is not None:
        logging.getLogger("gateway").warning(
            "IM_AUTH_SECRET is unset: tokens are checked against the random secret in %s "
            "(this machine's nodes and `python -m gateway token` share it; set IM_AUTH_SECRET "
            "for nodes on several machines, and IM_ENV=production to require it)", secret_file)
    # A line per connection opened and closed costs CPU and disk at 10k connections.
    logging.getLogger("websockets.server").setLevel(logging.WARNING)
    # aiormq logs a lost link with a traceback (and each refused connect again); the
    # broker logs one line per attempt with the cause, the next URL and the backoff.
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)
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
