"""The fault schedule ("nemesis") as a longer run: ``python -m bench.nemesis
--minutes N --seed S``. Three node processes on a private Redis and a private
SecantusDB (``--shared-mongo``: the local MongoDB-compatible server, no store
pause; ``--redis-cluster``: a private 3-master Redis Cluster, one master killed
instead of the whole Redis), RabbitMQ through one proxy per node; every fault kind again and again
in a seeded order (``testkit.nemesis.schedule.long_schedule``); then the
checker (``testkit.nemesis``). Prints the counts and writes the whole report to
``bench/out/nemesis-<seed>-<time>.json``. Exit 0 when every count that must be
zero is, 1 otherwise.

``--tree DIR``: the nodes run that checkout's code (``NodeProcess(tree=)``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from testkit.nemesis import (
    MUST_BE_ZERO,
    Nemesis,
    NemesisConfig,
    ci_schedule,
    dump,
    long_schedule,
    summary,
)

OUT = Path(__file__).resolve().parent / "out"


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.nemesis", description=__doc__)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--users", type=int, default=12)
    ap.add_argument("--ci", action="store_true", help="the pytest test's schedule (~75 s)")
    ap.add_argument("--shared-mongo", action="store_true")
    ap.add_argument("--redis-cluster", action="store_true",
                    help="a private 3-master Redis Cluster (a master killed, not the Redis)")
    ap.add_argument("--tree", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=OUT)
    return ap.parse_args(argv)


def _print_schedule(cfg: NemesisConfig, logs: Path) -> None:
    print(f"nemesis: {cfg.seconds:.0f} s of traffic, {len(cfg.schedule)} faults, "
          f"seed {cfg.seed}, node logs in {logs}", flush=True)
    for f in cfg.schedule:
        print(f"  {f.at:6.1f} s  {f.kind:<12} {f.duration:4.1f} s"
              + (f"  node {f.node}" if f.node >= 0 else ""), flush=True)


def _print_report(report: dict[str, Any], path: Path) -> None:
    print(json.dumps(summary(report), indent=2))
    for f in report["faults"]:
        print(f"  {f['kind']:<12} node {f['node']:>2} at {f['at_s']:>7} s  heal {f['heal_s']} s  "
              f"acks during/after {f['acks_during']}/{f['acks_after']}  room ok during/after "
              f"{f['room_ok_during']}/{f['room_ok_after']}  {f['skipped'] or f['evidence']}")
    for k, v in report.items():
        if k.startswith("details") and v:
            print(f"{k}: {json.dumps(v, default=str)[:3000]}")
    print(f"report: {path}  ({report['duration_s']} s)")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    seconds = 75.0 if args.ci else args.minutes * 60
    rc = args.redis_cluster
    schedule = (ci_schedule(redis_cluster=rc) if args.ci
                else long_schedule(seconds, args.seed, redis_cluster=rc))
    logs = Path(tempfile.mkdtemp(prefix="nemesis-logs-"))
    cfg = NemesisConfig(seconds=seconds, schedule=schedule, users=args.users, seed=args.seed,
                        private_mongo=not args.shared_mongo, tree=args.tree, log_dir=logs,
                        redis_cluster=rc)
    _print_schedule(cfg, logs)
    report = asyncio.run(Nemesis(cfg).run())
    report["node_logs"] = str(logs)
    path = args.out / f"nemesis-{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    dump(report, path)
    _print_report(report, path)
    return 0 if all(report.get(k) == 0 for k in MUST_BE_ZERO) else 1


if __name__ == "__main__":
    sys.exit(main())
