"""What a hook costs (docs/protocol.md, "Hooks"), same run, one node:

1. **saturation**: ``--pairs`` senders each sending 1:1 to a receiver of its
   own, one message at a time (closed loop), for ``--seconds``: acks/s and
   ack p50 / p99, with the hook off and on (``IM_HOOKS=send``, a local hook
   server answering ``allow`` at once, in a process of its own), alternating
   ``--rounds`` times;
2. **a slow hook**: ``IM_HOOKS=room_send`` and a hook that answers room
   messages after 2 s; a bystander's unhooked 1:1 sends (one at a time), p50
   / p99, before and while ``--waiting`` users each keep one hooked room
   message waiting for the hook.

    .venv/bin/python -m bench.hook_bench                 # about 2 minutes
    .venv/bin/python -m bench.hook_bench --seconds 5 --rounds 1

Nodes (``python -m gateway serve``) and the hook server are processes of
their own on 127.0.0.1, in a fresh namespace of the local Redis, RabbitMQ and
MongoDB-compatible server; the sends' budgets are off (the node's checks
still run). Every loop is bounded; it stops by itself. Writes
``bench/out/hook-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from bench import cli, common
from bench.cluster import Run
from bench.stats import percentile
from testkit.device import Device
from testkit.nodes import NodeProcess
from testkit.tokens import issue_token

HOOK_SECRET = "bench-hook-secret-0123456789"


async def hook_server(delay_room: float = 0.0) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "testkit.hook_server", "--secret", HOOK_SECRET,
        "--delay-room", str(delay_room), stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    url = (await asyncio.wait_for(proc.stdout.readline(), 15)).decode().strip()
    return proc, url


def summary(ms: list[float], seconds: float) -> dict[str, Any]:
    s = sorted(ms)
    return {"acks": len(s), "acks_per_s": round(len(s) / seconds, 1),
            "p50_ms": round(percentile(s, 50) or 0.0, 2),
            "p99_ms": round(percentile(s, 99) or 0.0, 2)}


async def saturate(run: Run, node: NodeProcess, pairs: int, seconds: float, tag: str
                   ) -> list[float]:
    devs = [await Device.open(node.ws_port, issue_token(run.secret, f"{tag}s{i}", 3600))
            for i in range(pairs)]
    out: list[float] = []
    until = time.perf_counter() + seconds

    async def sender(i: int, d: Device) -> None:
        n = 0
        while time.perf_counter() < until:
            t = time.perf_counter()
            r = await d.request("send", to=f"{tag}r{i}", cmid=f"{tag}-{i}-{n}", body=n)
            if r.get("op") != "ack":
                raise RuntimeError(f"not acked: {r}")
            out.append((time.perf_counter() - t) * 1000)
            n += 1

    try:
        await asyncio.gather(*(sender(i, d) for i, d in enumerate(devs)))
    finally:
        await asyncio.gather(*(d.close() for d in devs), return_exceptions=True)
    return out


async def one_at_a_time(d: Device, to: str, seconds: float, tag: str) -> list[float]:
    out: list[float] = []
    until = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < until:
        t = time.perf_counter()
        r = await d.request("send", to=to, cmid=f"{tag}-{n}", body=n)
        if r.get("op") != "ack":
            raise RuntimeError(f"not acked: {r}")
        out.append((time.perf_counter() - t) * 1000)
        n += 1
    return out


async def slow_hook(run: Run, args: argparse.Namespace) -> dict[str, Any]:
    proc, url = await hook_server(delay_room=2.0)
    node = (await run.start_nodes(run.namespace("slow"), 1, "slow", hook_url=url,
                                  hook_secret=HOOK_SECRET, hooks="room_send",
                                  hook_timeout_ms=5000))[0]
    try:
        by = await Device.open(node.ws_port, issue_token(run.secret, "bystander", 3600))
        await by.request("send", to="peer", cmid="warm", body=0)
        before = await one_at_a_time(by, "peer", args.seconds, "before")
        waiters = [await Device.open(node.ws_port, issue_token(run.secret, f"w{i}", 3600))
                   for i in range(args.waiting)]
        for d in waiters:
            assert (await d.request("join", room="slow"))["op"] == "joined"
        stop = asyncio.Event()
        hooked: list[float] = []

        async def keep_waiting(d: Device, i: int) -> None:
            n = 0
            while not stop.is_set():
                t = time.perf_counter()
                r = await d.request("room_send", timeout=10, room="slow", body=f"{i}-{n}")
                if r.get("op") == "ok":
                    hooked.append((time.perf_counter() - t) * 1000)
                n += 1

        tasks = [asyncio.create_task(keep_waiting(d, i)) for i, d in enumerate(waiters)]
        await asyncio.sleep(0.5)  # every waiter's first room message is at the hook
        during = await one_at_a_time(by, "peer", args.seconds, "during")
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for d in [by, *waiters]:
            await d.close()
        return {"bystander_before": summary(before, args.seconds),
                "bystander_while_hooks_wait": summary(during, args.seconds),
                "hooked_room_sends": summary(hooked, args.seconds),
                "waiting_users": args.waiting}
    finally:
        await run.stop_nodes([node])
        proc.kill()
        await proc.wait()


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    run = Run(args, "hook")
    res: dict[str, Any] = {}
    proc, url = await hook_server()
    try:
        off_ms: list[float] = []
        on_ms: list[float] = []
        for r in range(args.rounds):
            for mode in ("off", "on"):
                extra = {"hook_url": url, "hook_secret": HOOK_SECRET} if mode == "on" else {}
                node = (await run.start_nodes(run.namespace(f"{mode}{r}"), 1, f"{mode}{r}",
                                              **extra))[0]
                try:
                    got = await saturate(run, node, args.pairs, args.seconds, f"{mode}{r}")
                finally:
                    await run.stop_nodes([node])
                (on_ms if mode == "on" else off_ms).extend(got)
                common.say("hook", f"round {r} hook {mode}: {summary(got, args.seconds)}")
        total = args.seconds * args.rounds
        res["saturation"] = {"hook_off": summary(off_ms, total), "hook_on": summary(on_ms, total),
                             "pairs": args.pairs}
    finally:
        proc.kill()
        await proc.wait()
    try:
        res["slow_hook"] = await slow_hook(run, args)
    finally:
        res["cleanup"] = await run.cleanup()
    return res


def main(argv: list[str] | None = None) -> int:
    p = cli.new_parser("bench.hook_bench", __doc__, (
        ("--seconds", float, 10.0, "measured seconds per round and phase"),
        ("--rounds", int, 2, "off / on rounds of the saturation phase"),
        ("--pairs", int, 32, "concurrent senders in the saturation phase"),
        ("--waiting", int, 20, "users each keeping a hooked room message waiting"),
    ))
    args = cli.parse(p, argv)
    args.stamp = common.utc_stamp()
    res = {"command": cli.command_line("bench.hook_bench", argv or sys.argv[1:]),
           "utc": args.stamp, "machine": common.machine_facts(),
           "code": common.code_version(args.node_tree), **common.run_loop(run_all(args))}
    path = common.write_json(res, args.stamp, "hook")
    sat, slow = res["saturation"], res["slow_hook"]
    print(f"1:1 saturation, {sat['pairs']} senders: hook off {sat['hook_off']}; "
          f"hook on {sat['hook_on']}", file=sys.stderr)
    print(f"bystander 1:1 before {slow['bystander_before']}; while "
          f"{slow['waiting_users']} hooked room messages wait 2 s "
          f"{slow['bystander_while_hooks_wait']}", file=sys.stderr)
    print(f"results: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
