"""Phase 3 of ``bench.multinode_bench``: one of three nodes gets SIGKILL under load.

``failover_phase`` starts the nodes, runs the chat soak of ``testkit.soak`` (no
sync on reconnect, acks awaited 10 s) through the kill, stops the sends and
syncs users over HTTP; ``analyse`` turns what the users saw into times from the
kill, delivery counts, rates and a per-second timeline; ``failover_lines`` is
the phase's section of the report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections import Counter
from typing import Any

from bench import common
from bench.cluster import NODES, Run, process_names
from bench.report import fmt, lat, md_table, profile_section
from bench.stats import latency_summary, percentile
from testkit.soak import Endpoint, Soak, SoakUser

DRAIN_S = 10.0  # bound on finishing the sends in flight after the stop
PUSH_SETTLE_S = 1.5  # wait for the last pushes before the final sync


# -- what the users saw, and the phase -------------------------------------------
def _first_after(times: list[float], t0: float) -> float | None:
    later = [t for t in times if t >= t0]
    return min(later) if later else None


def _timing(samples: list[float | None]) -> dict[str, Any]:
    """Seconds after the kill (None = never) -> count, p50/p95/max in ms, how many never."""
    reached = [s for s in samples if s is not None]
    out = latency_summary(reached, (50, 95))
    out["clients"], out["never"] = len(samples), len(samples) - len(reached)
    return out


def _sync_check(soak: Soak) -> dict[str, Any]:
    """Users whose final sync answered: acked messages of theirs (in or out) it lacked."""
    synced = [u for u in soak.users if u.synced is not None]
    incoming: dict[str, set[int]] = {u.name: set() for u in soak.users}
    for u in soak.users:
        incoming[u.peer] |= {a.mid for a in u.acked.values()}
    absent = sum(len((incoming[u.name] | {a.mid for a in u.acked.values()}) - (u.synced or set()))
                 for u in synced)
    return {"synced_users": len(synced), "synced_acked_absent": absent}


def _moved(soak: Soak, victim: int, t_kill: float) -> dict[str, Any]:
    """Times from the kill, over the dead node's clients (see the report's labels)."""
    users = {u.name: u for u in soak.users}
    out: dict[str, list[float | None]] = {k: [] for k in _TIMING_LABELS}

    def since_kill(t: float | None) -> float | None:
        return None if t is None else t - t_kill

    for u in (u for u in soak.users if u.home == victim):
        t_re = _first_after([t for t, _ in u.connects], t_kill)
        out["connection_closed"].append(since_kill(_first_after(u.closes, t_kill)))
        out["reconnected"].append(since_kill(t_re))
        first_ack = since_kill(min((a.t for a in u.acked.values() if a.gen >= 2), default=None))
        out["first_ack_on_new_node"].append(first_ack)
        if _first_after(u.lost_sends, t_kill) is not None:
            out["first_ack_on_new_node_resent"].append(first_ack)
        r = users[u.peer]
        from_u = [g.t for g in r.got.values() if g.how == "push" and g.sender == u.name and g.t]
        to_u = [g.t for g in u.got.values() if g.how == "push" and g.t]
        if r.home != victim:
            out["first_push_from_moved_sender"].append(
                since_kill(None if t_re is None else _first_after(from_u, t_re)))
        out["first_push_to_moved_receiver"].append(
            since_kill(None if t_re is None else _first_after(to_u, t_re)))
    return {k: _timing(v) for k, v in out.items()}


def analyse(soak: Soak, victim: int, t_kill: float, t_stop: float,
            t_start: float) -> dict[str, Any]:
    counts = soak.counts()
    counts["missing_first"], counts["missing"] = counts["missing"][:20], len(counts["missing"])
    counts.update(_sync_check(soak))

    def rate(ts: list[float], a: float, b: float) -> float | None:
        return round(sum(1 for t in ts if a <= t < b) / (b - a), 1) if b > a else None

    settle = t_kill + (t_stop - t_kill) / 2
    ack_times = [t for t, _, _ in soak.acks]
    rates = {"acks_per_s_before_kill": rate(ack_times, t_start + 1, t_kill),
             "pushes_per_s_before_kill": rate(soak.pushes_at, t_start + 1, t_kill),
             "acks_per_s_second_half_after_kill": rate(ack_times, settle, t_stop),
             "pushes_per_s_second_half_after_kill": rate(soak.pushes_at, settle, t_stop)}
    reconnect_times = [t for u in soak.users for t, _ in u.connects if t >= t_kill]
    timeline = []
    for s in range(round(t_start - t_kill), round(t_stop - t_kill)):
        a, b = t_kill + s, t_kill + s + 1
        acks = [(lat, home) for t, lat, home in soak.acks if a <= t < b]
        stayed = sorted(lat for lat, home in acks if home != victim)
        p50 = percentile(stayed, 50)
        timeline.append({
            "s": s, "acks": len(acks), "acks_moved": sum(1 for _, h in acks if h == victim),
            "pushes": sum(1 for t in soak.pushes_at if a <= t < b),
            "reconnects": sum(1 for t in reconnect_times if a <= t < b),
            "ack_p50_ms_stayed": None if p50 is None else round(p50 * 1000),
            "ack_max_ms_stayed": round(stayed[-1] * 1000) if stayed else None})
    dead = [u for u in soak.users if u.home == victim]
    return {"counts": counts, "timings": _moved(soak, victim, t_kill), "rates": rates,
            "timeline": timeline, "dead_node_clients": len(dead),
            "dead_node_clients_now_on": {str(k): v for k, v in
                                         sorted(Counter(u.at for u in dead).items())}}


def sync_targets(soak: Soak, everyone: bool, sample: int) -> list[SoakUser]:
    """Who syncs at the end: every user with an acked incoming message no push
    brought (needed for the check), plus ``sample`` users spread over all nodes
    (they cross-check the sync path itself); or everyone."""
    if everyone:
        return list(soak.users)
    by_name = {u.name: u for u in soak.users}
    needed = {u.peer for u in soak.users
              if any(a.mid not in by_name[u.peer].got for a in u.acked.values())}
    step = max(1, len(soak.users) // max(1, sample))
    picked = {u.name for u in soak.users[::step][:sample]} if sample > 0 else set()
    return [u for u in soak.users if u.name in needed | picked]


async def final_sync(soak: Soak, users: list[SoakUser]) -> dict[str, Any]:
    """``GET /v1/sync?since=0``, every page, for ``users``: served from the MongoDB
    boxes, which is slow on SecantusDB, so few at a time, every page timed."""
    started, pages0 = time.perf_counter(), len(soak.sync_page_s)
    await soak.final_sync(users, timeout_s=max(180.0, 2.0 * len(soak.users)))
    page_s = soak.sync_page_s[pages0:]
    failures = dict(soak.sync_failures)
    return {"users": len(users), "pages": len(page_s),
            "retries_after_503": failures.pop("status 503", 0),
            "seconds": round(time.perf_counter() - started, 2), "failures": failures,
            "page_latency": latency_summary(page_s, (50, 99))}


async def failover_phase(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    ns = run.namespace("fo")
    nodes = await run.start_nodes(ns, NODES, "failover")
    victim = 0
    n = args.failover_clients
    soak = Soak([Endpoint(x.ws_url, x.http_url) for x in nodes],
                [f"{ns}-f-u{i}" for i in range(n)], run.secret,
                interval=args.failover_interval, ack_timeout=10.0, sync_on_connect=False,
                sync_concurrency=2)
    names = process_names(nodes)
    res: dict[str, Any] = {"namespace": ns, "nodes": [x.name for x in nodes],
                           "victim": nodes[victim].name, "users": n,
                           "interval_s": args.failover_interval,
                           "offered_per_s": round(n / args.failover_interval, 1)}
    try:
        await soak.connect_all(50)
        t_start = soak.start()
        await asyncio.sleep(1.05)
        meter = common.Meter(names)
        await asyncio.sleep(max(0.0, t_start + args.failover_before - time.perf_counter()))
        res["cpu_before_kill"] = meter.stop()[1]
        soak.endpoints[victim].up = False
        t_kill = time.perf_counter()
        nodes[victim].kill()
        meter = common.Meter(names)
        profile = (common.py_spy_later(  # a survivor, for the seconds right after the kill
            nodes[1].pid, 4, common.OUT_DIR / f"pyspy-multinode-{args.stamp}.txt")
            if args.profile else None)
        with contextlib.suppress(TimeoutError):
            res["victim_exit_code"] = await nodes[victim].wait(5)
        await asyncio.sleep(max(0.0, t_kill + args.failover_after - time.perf_counter()))
        res["cpu_after_kill"] = meter.stop()[1]
        t_stop = time.perf_counter()
        res["stuck_senders"] = await soak.stop(DRAIN_S)
        await asyncio.sleep(PUSH_SETTLE_S)
        await soak.disconnect()
        survivors = [x for i, x in enumerate(nodes) if i != victim]
        res["survivor_metrics"] = {x.name: common.metrics_delta({}, await common.fetch_metrics(
            x.http_url)) for x in survivors}
        res["final_sync"] = await final_sync(
            soak, sync_targets(soak, args.sync_all, args.sync_sample))
        if profile is not None:
            res["profile"] = await profile
        res.update(analyse(soak, victim, t_kill, t_stop, t_start))
        return res
    finally:
        await soak.close()
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
            ["... by push", c["by_push"]],
            ["... only by the final sync", c["by_sync"]],
            ["**missing** (acked, never received)", c["missing"]],
            ["received but never acked to the sender", c["unacked_received"]],
            ["duplicate pushes", c["duplicate_pushes"]],
            ["resends (same cmid)", c["resends"]], ["ack timeouts", c["ack_timeouts"]],
            ["error replies", ", ".join(f"{k}={v}" for k, v in c["errors"].items()) or "none"],
            ["failed connection attempts",
             ", ".join(f"{k}={v}" for k, v in c["connect_failures"].items()) or "none"],
            ["final sync", f"{fs['users']} users, {fs['pages']} pages in "
                           f"{fmt(fs['seconds'])} s (page p50 / p99 "
                           f"{lat(fs['page_latency'])} ms), 503s retried: "
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
