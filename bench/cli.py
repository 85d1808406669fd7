"""The command line both benchmarks share: the load options (pairs, window,
duration, warmup) and their checks, the loopback-only rule for every URL, and
the command as recorded in the results (``--secret`` redacted).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any
from urllib.parse import urlsplit

from bench import common

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def new_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """A parser for ``prog`` with the load options every benchmark takes."""
    p = argparse.ArgumentParser(prog=prog, description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=50, help="sender->receiver pairs (default 50)")
    p.add_argument("--window", type=int, default=32, help="in-flight sends per sender")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per phase")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    return p


def add_store_urls(p: argparse.ArgumentParser, amqp: bool = True) -> None:
    """``--mongo-url``, ``--redis-url`` (and ``--amqp-url``): the local servers by default."""
    p.add_argument("--mongo-url", default="mongodb://127.0.0.1:27017")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    if amqp:
        p.add_argument("--amqp-url", default=common.DEFAULT_AMQP_URL)


def check_loopback(p: argparse.ArgumentParser, urls: list[str]) -> None:
    """Exit with a usage error unless every URL is on loopback."""
    for url in urls:
        if urlsplit(url).hostname not in LOOPBACK:
            p.error(f"{url}: only 127.0.0.1 is allowed")


def check_load_args(p: argparse.ArgumentParser, args: argparse.Namespace,
                    urls: list[str]) -> None:
    """Exit with a usage error unless every URL is on loopback and the load options are sane."""
    check_loopback(p, urls)
    if min(args.pairs, args.window) < 1 or args.duration <= 0 or args.warmup < 0:
        p.error("--pairs and --window must be >= 1, --duration > 0, --warmup >= 0")


def note_invocation(args: argparse.Namespace, argv: list[str] | None) -> None:
    """Add what the results record: the arguments, the UTC stamp and the code version."""
    args.argv = sys.argv[1:] if argv is None else argv
    args.stamp = common.utc_stamp()
    args.code = common.code_version()


def execute(args: argparse.Namespace, argv: list[str] | None, run: Any,
            prefix: str) -> dict[str, Any] | None:
    """Note the invocation, ``run(args)`` on the node's event loop, write the results
    to ``bench/out/<prefix>-<stamp>.json`` (path in ``["json"]``); None on Ctrl-C
    (everything started was stopped and cleaned on the way out)."""
    note_invocation(args, argv)
    common.OUT_DIR.mkdir(parents=True, exist_ok=True)
    try:
        res: dict[str, Any] = common.run_loop(run(args))
    except KeyboardInterrupt:
        return None
    res["json"] = str(common.write_json(res, args.stamp, prefix))
    return res


def command_line(module: str, argv: list[str]) -> str:
    """How this run was started, for the results (``--secret``'s value left out)."""
    return f".venv/bin/python -m {module} " + shlex.join(redacted(argv))


def redacted(argv: list[str]) -> list[str]:
    """The command line without the value of ``--secret``."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == "--secret" and i + 1 < len(out):
            out[i + 1] = "***"
        elif a.startswith("--secret="):
            out[i] = "--secret=***"
    return out
