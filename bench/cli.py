"""What every benchmark's command line shares: the parser (options given as rows,
the load options of the chat benchmarks, the store URLs), the loopback-only
rule for every URL, and ``main``: run, record the results, print the report.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench import common

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# (flag, type, default, help) rows; the default is added to the help
Option = tuple[str, type, Any, str]
LOAD: tuple[Option, ...] = (  # the load options of chat_bench and multinode_bench
    ("--pairs", int, 50, "sender->receiver pairs"),
    ("--window", int, 32, "in-flight sends per sender"),
    ("--duration", float, 10.0, "measured seconds per phase"),
    ("--warmup", float, 2.0, "unmeasured seconds first"))
URLS = {"mongo": "mongodb://127.0.0.1:27017", "redis": "redis://127.0.0.1:6379/0",
        "amqp": os.environ.get("IM_AMQP_URL") or common.DEFAULT_AMQP_URL}  # the local servers


def new_parser(module: str, description: str | None, options: Iterable[Option] = (),
               urls: Iterable[str] = ("mongo", "redis", "amqp"), nodes: bool = True
               ) -> argparse.ArgumentParser:
    """A parser for ``python -m <module>`` with ``options``, ``--<name>-url`` for ``urls``
    and, for a benchmark that starts nodes, ``--node-tree``."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, kind, default, what in options:
        p.add_argument(flag, type=kind, default=default, help=f"{what} (default {default})")
    for name in urls:
        p.add_argument(f"--{name}-url", default=URLS[name])
    if "redis" in urls:
        p.add_argument("--redis-cluster", type=int, choices=(0, 1), default=0,
                       help="1: --redis-url lists the seeds of a Redis Cluster "
                       "(scripts/redis_cluster.sh); the nodes get IM_REDIS_CLUSTER=1")
    if nodes:
        p.add_argument("--node-tree", metavar="DIR", help="run the nodes from this checkout "
                       "(e.g. a git worktree of another commit); default: this one")
        p.add_argument("--workers", default="1", metavar="N",
                       help="each node started as a supervisor of N worker processes sharing "
                       "its ports (IM_WORKERS; auto: one per core); default 1: one process")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``p.parse_args``; a usage error unless every ``--*-url`` given is on loopback."""
    args = p.parse_args(argv)
    check_loopback(p, [v for k, v in vars(args).items() if k.endswith("_url") and v])
    if getattr(args, "node_tree", None) and not Path(args.node_tree, "gateway").is_dir():
        p.error(f"--node-tree {args.node_tree}: no gateway package there")
    return args


def check_loopback(p: argparse.ArgumentParser, urls: list[str]) -> None:
    """Exit with a usage error unless every URL is on loopback."""
    for url in (u.strip() for many in urls for u in many.split(",")):
        if urlsplit(url).hostname not in LOOPBACK:
            p.error(f"{url}: only 127.0.0.1 is allowed")


def check_load_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit with a usage error unless the ``LOAD`` options are sane."""
    if min(args.pairs, args.window) < 1 or args.duration <= 0 or args.warmup < 0:
        p.error("--pairs and --window must be >= 1, --duration > 0, --warmup >= 0")


def main(module: str, argv: list[str] | None, parse_args: Callable[[Any], argparse.Namespace],
         run: Any, render: Callable[[dict[str, Any]], str],
         failed: Callable[[dict[str, Any]], bool] = lambda res: False) -> int:
    """A benchmark's ``main``: parse; ``run(args)`` on the event loop (uvloop, as the
    node); its results, after the command line, UTC stamp, machine, code version and
    settings (the options but ``--secret``), go to ``bench/out/<prefix>-<stamp>.json``
    (path in ``["json"]``; prefix: the module's name without ``_bench``, ``_`` -> ``-``);
    print ``render(results)`` and that path. 130 on Ctrl-C (everything started was
    stopped and cleaned on the way out), 1 if ``failed(results)``, else 0."""
    args = parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.stamp = common.utc_stamp()
    args.code = common.code_version(getattr(args, "node_tree", None))
    res: dict[str, Any] = {"command": command_line(module, args.argv), "utc": args.stamp,
                           "machine": common.machine_facts(), "code": args.code,
                           "settings": {k: v for k, v in vars(args).items()
                                        if k not in ("argv", "stamp", "code", "secret")}}
    common.OUT_DIR.mkdir(parents=True, exist_ok=True)
    try:
        res.update(common.run_loop(run(args)))
    except KeyboardInterrupt:
        return 130
    prefix = module.removeprefix("bench.").removesuffix("_bench").replace("_", "-")
    res["json"] = str(common.write_json(res, args.stamp, prefix))
    print(render(res).rstrip() + f"\n\nResults: `{res['json']}`")
    return 1 if failed(res) else 0


def command_line(module: str, argv: list[str]) -> str:
    """How this run was started, for the results (``--secret``'s value left out)."""
    return f".venv/bin/python -m {module} {shlex.join(redacted(argv))}".rstrip()


def redacted(argv: list[str]) -> list[str]:
    """The command line without the value of ``--secret``."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == "--secret" and i + 1 < len(out):
            out[i + 1] = "***"
        elif a.startswith("--secret="):
            out[i] = "--secret=***"
    return out
