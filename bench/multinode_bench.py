"""Multi-node benchmark: what the broker hop costs, and how long a kill -9 hurts.

Run from the repository root (it starts its own nodes, uses the local Redis,
RabbitMQ and MongoDB-compatible server, and cleans up after itself)::

    .venv/bin/python -m bench.multinode_bench      # 50 pairs, window 32, 10 s, 300 failover users

Phases, all in one run; each phase has its own namespace (Redis key prefix,
MongoDB database, RabbitMQ exchanges), dropped at the end:

1. **One node, saturation.** P sender->receiver pairs on one node, each
   sender keeping W sends in flight (closed loop; the load generator of
   ``bench/load.py``). After ``--warmup`` s, for ``--duration`` s:
   acks/s and deliveries/s (pushes received) of the messages sent in that
   window, and ack / delivery latency. In a closed loop the latency is mostly
   queueing (about P*W / rate): read it as "how deep the queue is", not as
   the latency of a lightly loaded node (``bench.chat_bench`` measures that).
2. **Three nodes, saturation.** Same P, W and timing, clients spread evenly:
   sender i on node i % 3, its receiver on node (i+1) % 3, so every push
   crosses RabbitMQ. Per node: acks/s of the senders connected to it,
   deliveries/s of the receivers connected to it, its CPU, and its own
   counters from ``/metrics``; then the totals. **Ratio** = 3-node total /
   1-node figure, for acks/s and deliveries/s. The issue's target is >= 0.8
   (the broker hop costs little). All processes share this machine's cores
   and one store, so more nodes add no capacity here: expect the total to
   stay near the one-node figure. A ratio below 1 is the hop, three
   processes competing for the same cores, or the store slowing down with
   more concurrent writers (each node has its own write batches in flight):
   compare the nodes' CPU (the hop's cost shows there) with the store's.
   Single runs vary by +-15% on this machine; compare several.
3. **Failover.** Three fresh nodes, ``--failover-clients`` users spread
   evenly (user i on node i % 3), each one WebSocket, sending to user i+1 (on
   another node) one message every ``--failover-interval`` s with at most one
   in flight: a send that is not acked (connection lost, ``unavailable``, no
   reply within 10 s) is resent with the same ``cmid``. After
   ``--failover-before`` s node 0 gets SIGKILL. Each of its clients, when its
   connection closes, reconnects to the surviving nodes round robin and
   resends. Sending stops ``--failover-after`` s after the kill (longer than
   the heartbeat TTL, so routes to the dead node have lapsed by then). Times
   from the kill, over the dead node's clients: (a) reconnected (handshake
   done), (b) first ack on the new node, (b') the same for those that had a
   send in flight (resent at once; the others wait for their next scheduled
   send); over the receivers on surviving nodes whose senders were on the
   dead node: (c) first push from that sender received after the sender
   reconnected; over the dead node's clients as
   receivers: (d) first push on their new connection. p50 / p95 / max, and
   how many never got there. Then users sync over HTTP (``GET
   /v1/sync?since=0``, every page): each user with an acked incoming message
   that no push brought, plus ``--sync-sample`` users spread over all nodes
   whose sync answer must hold every acked message they sent or received (a
   check of the sync path itself; ``--sync-all`` syncs everyone, slowly:
   ``since=0`` is served from MongoDB, about 0.5 s of SecantusDB per page at
   this size). The counts say whether every acked message reached its
   receiver: sent (distinct cmids), acked, received (by push, or only by
   sync), missing (acked, never received: should be 0). A per-second
   timeline around the kill (acks, pushes, reconnects, ack latency of the
   clients that did not move) shows the dip. ``--profile`` py-spies a
   surviving node for 4 s from the kill. The defaults (300 users, one send
   per 0.2 s) offer 1,500 msgs/s, more than a 2-core machine with SecantusDB
   stores (~700-900): the report then says the cluster was saturated and the
   times include queueing; ``--failover-interval 1`` leaves headroom.

Output: a markdown report on stdout; everything as JSON in
``bench/out/multinode-<UTC timestamp>.json``, node logs beside it. All traffic
goes to 127.0.0.1; every wait is bounded; nodes are stopped (or killed) in
``finally`` blocks.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench import cli, common, report
from bench.cluster import NODES, Run, process_names
from bench.failover import failover_lines, failover_phase
from bench.load import open_load, saturate
from bench.report import cleanup_line, fmt, header_lines, lat, load_section, md_table, node_lines

TARGET_RATIO = 0.8


# -- saturation (phases 1 and 2) -----------------------------------------------------
async def saturation_phase(args: argparse.Namespace, run: Run, n_nodes: int,
                           phase: int) -> dict[str, Any]:
    """Closed loop for warmup + duration on ``n_nodes`` fresh nodes; totals, then per node."""
    ns = run.namespace(f"{n_nodes}n")
    nodes = await run.start_nodes(ns, n_nodes, f"sat{n_nodes}")
    try:
        load = await open_load([n.ws_url for n in nodes], run.secret, args.pairs, f"{ns}-p")
        try:
            result, deltas = await saturate(load, phase, process_names(nodes), nodes, args)
            result["unexpected_frames"] = dict(load.other)
        finally:
            await load.close()
    finally:
        await run.stop_nodes(nodes)
    result["namespace"], result["per_node"] = ns, []
    for i, node in enumerate(nodes):
        acks = sum(s.acked[phase] for s in load.senders if s.node == i)
        got = sum(r.got[phase] for r in load.receivers if r.node == i)
        result["per_node"].append({
            "node": node.name, "pid": node.pid, "acks_per_s": round(acks / result["seconds"], 1),
            "deliveries_per_s": round(got / result["seconds"], 1),
            "cores": result["cpu"]["by_pid"].get(str(node.pid)), "metrics": deltas[i]})
    return result


# -- report ----------------------------------------------------------------------------
def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def ratios(one: dict[str, Any], three: dict[str, Any]) -> dict[str, Any]:
    return {"acks": _ratio(three["acks_per_s"], one["acks_per_s"]),
            "deliveries": _ratio(three["deliveries_per_s"], one["deliveries_per_s"]),
            "target": TARGET_RATIO}


def _per_node_lines(r: dict[str, Any]) -> list[str]:
    rows = []
    for i, n in enumerate(r["per_node"]):
        c = n["metrics"]["counters"]
        errors = sum(v for k, v in c.items() if k.startswith("im_errors_total"))
        rows.append([f"{i} {n['node']}", n["acks_per_s"], n["deliveries_per_s"], n["cores"],
                     c.get('im_sends_total{outcome="stored"}', 0), c.get("im_pushes_total", 0),
                     n["metrics"]["mean_batch_size"].get("mongo"), errors])
    rows.append(["**total**", r["acks_per_s"], r["deliveries_per_s"],
                 round(sum(n["cores"] or 0 for n in r["per_node"]), 3),
                 sum(row[4] for row in rows), sum(row[5] for row in rows), None,
                 sum(row[7] for row in rows)])
    header = ["node", "acks/s (its senders)", "deliveries/s (its receivers)", "CPU cores",
              "node: sends stored", "node: pushes written", "node: mean Mongo batch",
              "node: error replies"]
    return ["Per node (client-side rates; node counters over the same window):", ""] + \
        md_table(header, rows)


def _ratio_lines(res: dict[str, Any]) -> list[str]:
    one, three, rt = res["one_node"], res["three_nodes"], res["ratios"]
    rows = [["acks/s", one["acks_per_s"], three["acks_per_s"], rt["acks"]],
            ["deliveries/s", one["deliveries_per_s"], three["deliveries_per_s"],
             rt["deliveries"]],
            ["ack latency p50 / p99 (ms)", lat(one["ack_latency"]),
             lat(three["ack_latency"]), None],
            ["delivery latency p50 / p99 (ms)", lat(one["delivery_latency"]),
             lat(three["delivery_latency"]), None],
            ["machine CPU busy %", one["cpu"]["machine_busy_pct"],
             three["cpu"]["machine_busy_pct"], None]]
    verdict = ("meets" if min(rt["acks"] or 0, rt["deliveries"] or 0) >= TARGET_RATIO
               else "misses")
    return (["## Ratios: 3 nodes / 1 node", ""]
            + md_table(["figure", "1 node", "3 nodes", "ratio"], rows)
            + [f"Target ratio >= {TARGET_RATIO}: this run **{verdict}** it "
               f"(acks {fmt(rt['acks'])}, deliveries {fmt(rt['deliveries'])}).", ""])


def render(res: dict[str, Any]) -> str:
    s = res["settings"]
    lines = header_lines("Multi-node benchmark", res, "; every node, the load generator, "
                         "Redis, RabbitMQ and the store share these CPUs")
    lines += [f"- saturation: pairs {s['pairs']}, window {s['window']}, duration "
             f"{s['duration']} s, warmup {s['warmup']} s; failover: {s['failover_clients']} "
             f"users, interval {s['failover_interval']} s, kill after "
             f"{s['failover_before']} s, run on {s['failover_after']} s; node heartbeat "
             "defaults (IM_HEARTBEAT_S 2, IM_HEARTBEAT_TTL_S 6)",
             f"- namespaces: {', '.join(res['namespaces'])}", ""]
    for key, title in (("one_node", "1. One node, saturation (closed loop)"),
                       ("three_nodes", "2. Three nodes, saturation (every push crosses "
                                       "RabbitMQ)")):
        r = res.get(key)
        if r is None:
            continue
        lines += report.failed_lines(title, r) or load_section(title, r)
        if key == "three_nodes" and "error" not in r:
            lines += _per_node_lines(r)
    if res.get("ratios"):
        lines += _ratio_lines(res)
    f = res.get("failover")
    if f is not None:
        lines += report.failed_lines("3. Failover", f) or failover_lines(f)
    lines += ["## Node logs", ""] + node_lines(res["nodes"]) + [""]
    lines += [cleanup_line(res["cleanup"])]
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.new_parser("bench.multinode_bench", __doc__, cli.LOAD + (
        ("--failover-clients", int, 300, "users in phase 3"),
        ("--failover-interval", float, 0.2, "seconds between one user's sends in phase 3"),
        ("--failover-before", float, 5.0, "seconds of traffic before the kill"),
        ("--failover-after", float, 15.0, "seconds of traffic after the kill"),
        ("--sync-sample", int, 12, "phase 3: users synced at the end besides those a push "
                                   "missed")))
    p.add_argument("--sync-all", action="store_true",
                   help="phase 3: every user syncs at the end (slow: since=0 is served by "
                        "MongoDB)")
    p.add_argument("--profile", action="store_true",
                   help="phase 3: py-spy a surviving node for 4 s from the kill")
    p.add_argument("--skip-saturation", action="store_true", help="phase 3 only")
    p.add_argument("--skip-failover", action="store_true", help="phases 1 and 2 only")
    args = cli.parse(p, argv)
    cli.check_load_args(p, args)
    if args.failover_clients < 2 * NODES or args.failover_interval <= 0:
        p.error(f"--failover-clients must be >= {2 * NODES}, --failover-interval > 0")
    if args.failover_before < 2 or args.failover_after < 2:
        p.error("--failover-before and --failover-after must be >= 2 s")
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    r = Run(args, "multinode")
    res: dict[str, Any] = {"namespaces": r.namespaces}
    phases: list[tuple[str, Any]] = []
    if not args.skip_saturation:
        phases += [("one_node", lambda: saturation_phase(args, r, 1, 1)),
                   ("three_nodes", lambda: saturation_phase(args, r, NODES, 2))]
    if not args.skip_failover:
        phases.append(("failover", lambda: failover_phase(args, r)))
    try:
        for key, phase in phases:
            res[key] = await common.reported(phase())
    finally:
        res["nodes"] = r.nodes
        res["cleanup"] = await r.cleanup()
    one, three = res.get("one_node"), res.get("three_nodes")
    if one and three and "error" not in one and "error" not in three:
        res["ratios"] = ratios(one, three)
    return res


def main(argv: list[str] | None = None) -> int:
    return cli.main("bench.multinode_bench", argv, parse_args, run, render, lambda res: any(
        "error" in res.get(k, {}) for k in ("one_node", "three_nodes", "failover")))


if __name__ == "__main__":
    raise SystemExit(main())
