"""Phase 3 of ``bench.multinode_bench``: one of three nodes gets SIGKILL under load.

``failover_phase`` starts the nodes, runs the users of ``bench.failover_load``
through the kill, stops the sends and syncs users over HTTP; ``analyse`` turns
what the users saw into times from the kill, delivery counts, rates and a
per-second timeline; ``failover_lines`` is the phase's section of the report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections import Counter
from typing import Any

from bench import common
from bench.cluster import NODES, Run
from bench.failover_load import Failover, FoUser
from bench.load import Meter, stop_pumps
from bench.report import fmt, md_table, profile_section

DRAIN_S = 10.0  # bound on finishing the sends in flight after the stop
PUSH_SETTLE_S = 1.5  # wait for the last pushes before the final sync


# -- what the users saw, and the phase -------------------------------------------
def _first_after(times: list[float], t0: float) -> float | None:
    later = [t for t in times if t >= t0]
    return min(later) if later else None


def _timing(samples: list[float | None]) -> dict[str, Any]:
    """Seconds after the kill (None = never) -> count, p50/p95/max in ms, how many never."""
    reached = [s for s in samples if s is not None]
    out = common.latency_summary(reached, (50, 95))
    out["clients"], out["never"] = len(samples), len(samples) - len(reached)
    return out


def _sync_check(fo: Failover) -> dict[str, Any]:
    """Users whose final sync answered: acked messages of theirs (in or out) it lacked."""
    synced = [u for u in fo.users if u.synced is not None]
    incoming: dict[str, set[int]] = {u.name: set() for u in fo.users}
    for u in fo.users:
        for mid, _, _ in u.acked.values():
            incoming[u.peer].add(mid)
    absent = 0
    for u in synced:
        assert u.synced is not None
        expected = incoming[u.name] | {mid for mid, _, _ in u.acked.values()}
        absent += len(expected - u.synced)
    return {"synced_users": len(synced), "synced_acked_absent": absent}


def analyse(fo: Failover, victim: int, t_kill: float, t_stop: float,
            t_start: float) -> dict[str, Any]:
    users = {u.name: u for u in fo.users}
    by_push = only_sync = 0
    missing: list[dict[str, Any]] = []
    acked_mids: set[int] = set()
    for u in fo.users:
        r = users[u.peer]
        for cmid, (mid, gen, _) in u.acked.items():
            acked_mids.add(mid)
            got = r.got.get(mid)
            if got is None:
                missing.append({"from": u.name, "to": r.name, "cmid": cmid, "mid": mid,
                                "acked_on_connection": gen})
            elif got[2] == "push":
                by_push += 1
            else:
                only_sync += 1
    unacked = sum(1 for u in fo.users for mid in u.got if mid not in acked_mids)
    errors: Counter[str] = Counter()
    for u in fo.users:
        errors.update(u.errors)
    sent, acked = sum(u.sent for u in fo.users), sum(len(u.acked) for u in fo.users)
    counts = {"sent": sent, "acked": acked, "received": by_push + only_sync,
              "received_by_push": by_push, "received_only_by_sync": only_sync,
              "missing": len(missing), "missing_first": missing[:20],
              "received_never_acked": unacked,
              "duplicate_pushes": sum(u.dup_pushes for u in fo.users),
              "resends": sum(u.attempts for u in fo.users) - sent,
              "ack_timeouts": sum(u.timeouts for u in fo.users), "errors": dict(errors),
              "connect_failures": dict(fo.connect_failures), "unexpected_frames": dict(fo.other),
              **_sync_check(fo)}

    dead = [u for u in fo.users if u.home == victim]
    closed, reconnected, first_ack, moved_sender, moved_receiver = [], [], [], [], []
    first_ack_resent: list[float | None] = []
    for u in dead:
        t_close = _first_after(u.closes, t_kill)
        t_re = _first_after([t for t, _ in u.connects], t_kill)
        t_ack = min((t for _, gen, t in u.acked.values() if gen >= 2), default=None)
        closed.append(None if t_close is None else t_close - t_kill)
        reconnected.append(None if t_re is None else t_re - t_kill)
        first_ack.append(None if t_ack is None else t_ack - t_kill)
        if _first_after(u.lost_sends, t_kill) is not None:
            first_ack_resent.append(first_ack[-1])
        r = users[u.peer]
        pushes_from = [t for t, frm, how in r.got.values() if how == "push" and frm == u.name
                       and t is not None]
        pushes_to = [t for t, _, how in u.got.values() if how == "push" and t is not None]
        if r.home != victim:
            t = None if t_re is None else _first_after(pushes_from, t_re)
            moved_sender.append(None if t is None else t - t_kill)
        t = None if t_re is None else _first_after(pushes_to, t_re)
        moved_receiver.append(None if t is None else t - t_kill)
    timings = {"connection_closed": _timing(closed), "reconnected": _timing(reconnected),
               "first_ack_on_new_node": _timing(first_ack),
               "first_ack_on_new_node_resent": _timing(first_ack_resent),
               "first_push_from_moved_sender": _timing(moved_sender),
               "first_push_to_moved_receiver": _timing(moved_receiver)}
    new_node = Counter(u.at for u in dead)

    def rate(ts: list[float], a: float, b: float) -> float | None:
        return round(sum(1 for t in ts if a <= t < b) / (b - a), 1) if b > a else None

    settle = t_kill + (t_stop - t_kill) / 2
    ack_times = [t for t, _, _ in fo.acks]
    rates = {"acks_per_s_before_kill": rate(ack_times, t_start + 1, t_kill),
             "pushes_per_s_before_kill": rate(fo.pushes_at, t_start + 1, t_kill),
             "acks_per_s_second_half_after_kill": rate(ack_times, settle, t_stop),
             "pushes_per_s_second_half_after_kill": rate(fo.pushes_at, settle, t_stop)}
    reconnect_times = [t for u in fo.users for t, _ in u.connects if t >= t_kill]
    timeline = []
    for s in range(round(t_start - t_kill), round(t_stop - t_kill)):
        a, b = t_kill + s, t_kill + s + 1
        acks = [(lat, home) for t, lat, home in fo.acks if a <= t < b]
        stayed = sorted(lat for lat, home in acks if home != victim)
        p50 = common.percentile(stayed, 50)
        timeline.append({
            "s": s, "acks": len(acks), "acks_moved": sum(1 for _, h in acks if h == victim),
            "pushes": sum(1 for t in fo.pushes_at if a <= t < b),
            "reconnects": sum(1 for t in reconnect_times if a <= t < b),
            "ack_p50_ms_stayed": None if p50 is None else round(p50 * 1000),
            "ack_max_ms_stayed": round(stayed[-1] * 1000) if stayed else None})
    return {"counts": counts, "timings": timings, "rates": rates, "timeline": timeline,
            "dead_node_clients": len(dead),
            "dead_node_clients_now_on": {str(k): v for k, v in sorted(new_node.items())}}


def sync_targets(fo: Failover, everyone: bool, sample: int) -> list[FoUser]:
    """Who syncs at the end: every user with an acked incoming message no push
    brought (needed for the check), plus ``sample`` users spread over all nodes
    (they cross-check the sync path itself); or everyone."""
    if everyone:
        return list(fo.users)
    by_name = {u.name: u for u in fo.users}
    needed = {u.peer for u in fo.users
              if any(mid not in by_name[u.peer].got for mid, _, _ in u.acked.values())}
    step = max(1, len(fo.users) // max(1, sample))
    picked = {u.name for u in fo.users[::step][:sample]} if sample > 0 else set()
    return [u for u in fo.users if u.name in needed | picked]


async def failover_phase(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    ns = run.namespace("fo")
    nodes = await run.start_nodes(ns, NODES, "failover")
    victim = 0
    fo = Failover([n.ws_url for n in nodes], run.secret, args.failover_clients,
                  args.failover_interval, f"{ns}-f")
    names = {os.getpid(): "load generator (this process)"}
    names |= {n.pid: f"node {i} {n.name}" for i, n in enumerate(nodes)}
    res: dict[str, Any] = {"namespace": ns, "nodes": [n.name for n in nodes],
                           "victim": nodes[victim].name, "users": len(fo.users),
                           "interval_s": args.failover_interval,
                           "offered_per_s": round(len(fo.users) / args.failover_interval, 1)}
    pumps: list[asyncio.Task[None]] = []
    try:
        sem = asyncio.Semaphore(50)

        async def first(u: FoUser) -> None:
            async with sem:
                await fo.connect(u, u.home)

        async with asyncio.timeout(120):
            await asyncio.gather(*(first(u) for u in fo.users))
        t_start = time.perf_counter() + 0.05
        pumps = [asyncio.create_task(fo.pump(u, t_start + args.failover_interval * i /
                                             len(fo.users))) for i, u in enumerate(fo.users)]
        await asyncio.sleep(1.05)
        meter = Meter(names)
        await asyncio.sleep(max(0.0, t_start + args.failover_before - time.perf_counter()))
        res["cpu_before_kill"] = meter.stop()[1]
        fo.up[victim] = False
        t_kill = time.perf_counter()
        nodes[victim].kill()
        meter = Meter(names)
        profile = None
        if args.profile:  # a survivor, for the seconds right after the kill
            out = common.OUT_DIR / f"pyspy-multinode-{args.stamp}.txt"
            profile = asyncio.create_task(common.py_spy_record(nodes[1].pid, 4, out))
        with contextlib.suppress(TimeoutError):
            assert nodes[victim].proc is not None
            res["victim_exit_code"] = await asyncio.wait_for(nodes[victim].proc.wait(), 5)
        await asyncio.sleep(max(0.0, t_kill + args.failover_after - time.perf_counter()))
        res["cpu_after_kill"] = meter.stop()[1]
        t_stop = time.perf_counter()
        fo.stopping, fo.hard_deadline = True, t_stop + DRAIN_S
        res["stuck_senders"] = await stop_pumps(pumps)
        await asyncio.sleep(PUSH_SETTLE_S)
        await fo.close()
        survivors = [n for i, n in enumerate(nodes) if i != victim]
        res["survivor_metrics"] = {n.name: common.metrics_delta({}, await common.fetch_metrics(
            n.http_url)) for n in survivors}
        res["final_sync"] = await fo.final_sync(
            sync_targets(fo, args.sync_all, args.sync_sample), [n.http_url for n in survivors],
            timeout_s=max(180.0, 2.0 * len(fo.users)))
        if profile is not None:
            res["profile"] = await profile
        res.update(analyse(fo, victim, t_kill, t_stop, t_start))
        return res
    finally:
        for t in pumps:
            t.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        await fo.close()
        await run.stop_nodes(nodes)


# -- report ----------------------------------------------------------------------
_TIMING_LABELS = {
    "connection_closed": "(0) dead node's clients: connection close seen",
    "reconnected": "(a) dead node's clients: reconnected (handshake done)",
    "first_ack_on_new_node": "(b) dead node's clients: first ack on the new node",
    "first_ack_on_new_node_resent": "(b') ... of those that had a send in flight (resent at "
                                    "once)",
    "first_push_from_moved_sender": "(c) receivers on survivors: first push from their "
                                    "moved sender",
    "first_push_to_moved_receiver": "(d) dead node's clients as receivers: first push on the "
                                    "new connection",
}


def failover_lines(f: dict[str, Any]) -> list[str]:
    lines = ["## 3. Failover (kill -9 of one of three nodes)", "",
             f"{f['users']} users, one send per {f['interval_s']} s each, at most one in "
             f"flight (offered {fmt(f['offered_per_s'])} msgs/s); killed "
             f"{f['victim']} (exit code {f.get('victim_exit_code')}); its "
             f"{f['dead_node_clients']} clients moved to nodes "
             f"{f['dead_node_clients_now_on']} (by index).", ""]
    achieved = f["rates"]["acks_per_s_before_kill"] or 0.0
    if achieved < 0.9 * f["offered_per_s"]:
        lines += [f"Note: before the kill the cluster acked {fmt(achieved)} msgs/s of the "
                  f"{fmt(f['offered_per_s'])} offered: it was saturated, so sends queued and "
                  "the times below include that queueing (a larger --failover-interval "
                  "measures an unloaded cluster).", ""]
    rows = [[_TIMING_LABELS[k], t["clients"], t["never"], t["p50_ms"], t["p95_ms"],
             t["max_ms"]] for k, t in f["timings"].items()]
    lines += md_table(["time from the kill", "clients", "never", "p50 ms", "p95 ms",
                       "max ms"], rows)
    lines += ["(b), (c) and (d) include, for a client with nothing in flight at the kill, the "
              f"wait for its next scheduled send (up to {f['interval_s']} s); (b') leaves those "
              "out.", ""]
    c, fs = f["counts"], f["final_sync"]
    rows = [["sent (distinct cmids)", c["sent"]], ["acked", c["acked"]],
            ["received (push or final sync)", c["received"]],
            ["... by push", c["received_by_push"]],
            ["... only by the final sync", c["received_only_by_sync"]],
            ["**missing** (acked, never received)", c["missing"]],
            ["received but never acked to the sender", c["received_never_acked"]],
            ["duplicate pushes", c["duplicate_pushes"]],
            ["resends (same cmid)", c["resends"]], ["ack timeouts", c["ack_timeouts"]],
            ["error replies", ", ".join(f"{k}={v}" for k, v in c["errors"].items()) or "none"],
            ["failed connection attempts",
             ", ".join(f"{k}={v}" for k, v in c["connect_failures"].items()) or "none"],
            ["final sync", f"{fs['users']} users, {fs['pages']} pages in "
                           f"{fmt(fs['seconds'])} s (page p50 / p99 "
                           f"{fmt(fs['page_latency']['p50_ms'])} / "
                           f"{fmt(fs['page_latency']['p99_ms'])} ms), 503s retried: "
                           f"{fs['retries_after_503']}, failures: {fs['failures'] or 'none'}"],
            ["synced users: their acked messages (in or out) absent from the sync",
             f"{c['synced_acked_absent']} (over {c['synced_users']} users)"]]
    rt = f["rates"]
    rows += [["acks/s before the kill", rt["acks_per_s_before_kill"]],
             ["acks/s, second half after the kill", rt["acks_per_s_second_half_after_kill"]],
             ["pushes/s before / second half after",
              f"{fmt(rt['pushes_per_s_before_kill'])} / "
              f"{fmt(rt['pushes_per_s_second_half_after_kill'])}"]]
    for key, label in (("cpu_before_kill", "before"), ("cpu_after_kill", "after")):
        cpu = f[key]
        top = ", ".join(f"{p['what'][:24]} {p['cores']:.2f}" for p in cpu["top"][:4])
        rows.append([f"CPU {label} the kill: machine busy % / top cores",
                     f"{fmt(cpu['machine_busy_pct'])} / {top}"])
    lines += md_table(["delivery check", "value"], rows)
    if c["missing_first"]:
        lines += ["Missing (first 20): " + ", ".join(
            f"{m['from']}->{m['to']} {m['cmid']} mid {m['mid']}" for m in c["missing_first"]),
            ""]
    tl = f["timeline"]
    lines += ["Timeline, per second from the kill (s = 0 is the first second after it):", ""]
    lines += md_table(["s"] + [str(x["s"]) for x in tl],
                      [["acks"] + [x["acks"] for x in tl],
                       ["... of moved clients"] + [x["acks_moved"] for x in tl],
                       ["pushes"] + [x["pushes"] for x in tl],
                       ["reconnects"] + [x["reconnects"] for x in tl],
                       ["ack p50 ms, clients that stayed"] + [x["ack_p50_ms_stayed"] for x in tl],
                       ["ack max ms, clients that stayed"] + [x["ack_max_ms_stayed"] for x in tl]])
    lines += ["(ack latency = first send of a message -> its ack, resends included; the "
              "timeline counts acks when they arrive.)", ""]
    return lines + profile_section(f.get("profile"))
