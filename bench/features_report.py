"""The markdown report of ``bench.features_bench`` (from its JSON result)."""

from __future__ import annotations

import os
from typing import Any

from bench.report import cleanup_line, failed_lines, fmt, header_lines, lat, md_table, node_lines

WATCHED, UNWATCHED, PEER = "fb-u", "fb-solo", "fb-peer"  # the benchmark's users
BUSY_CORES = 0.85  # the benchmark process at this or more: "near a full core"


# -- report ---------------------------------------------------------------------------
def _reached(got: int, expected: int) -> str:
    return f"{got:,}/{expected:,} " + ("(all)" if got >= expected else "**(NOT ALL)**")


def _lat_row(what: str, s: dict[str, Any], reached: str = "-") -> list[Any]:
    return [what, s["count"], lat(s), s["max_ms"], reached]


def _cpu_rows(cpu: dict[str, Any], labels: dict[str, str]) -> list[list[Any]]:
    rows = []
    for key, label in labels.items():
        c = cpu[key]
        per = " / ".join(fmt(x) for x in c["node_ms_per_op"]) if c["ops"] else "-"
        rows.append([label, c["seconds"], c["ops"] or "-",
                     " / ".join(fmt(x) for x in c["node_cores"]), per,
                     c["nodes_ms_per_op"], c.get("nodes_net_ms_per_op"), c["bench_cores"],
                     c["machine_busy_pct"]])
    return rows


TICK_NOTE = (f"/proc counts CPU in ticks of {1000 / os.sysconf('SC_CLK_TCK'):g} ms per "
             "process: in a short window with few operations the per-operation figures are "
             "coarse.")
CPU_HEADER = ["window", "s", "ops", "node 0 / 1 / 2 cores", "node 0 / 1 / 2 CPU ms/op",
              "3 nodes ms/op", "3 nodes ms/op net of idle", "bench cores", "machine busy %"]


def _busiest(cpu: dict[str, Any], labels: dict[str, str]) -> list[str]:
    out = []
    for key, label in labels.items():
        top = ", ".join(f"{p['what'][:40]} {fmt(p['cores'])}" for p in cpu[key]["top"][:5])
        out.append(f"- busiest processes, {label} (cores): {top}")
    return out + [""]


def presence_lines(res: dict[str, Any]) -> list[str]:
    r, s = res.get("presence", {}), res["settings"]
    title = "1. Login with presence watchers"
    if "error" in r:
        return failed_lines(title, r)
    w, sd = r["watchers"], r["sends"]
    lines = [f"## {title}", "",
             f"{w:,} watchers ({' / '.join(map(str, r['watchers_per_node']))} on nodes "
             f"0 / 1 / 2), each a device that `presence_sub`s to `{WATCHED}`; "
             f"`{WATCHED}` logs in on node 0, {s['cycles']} cycles (after a warm-up); "
             f"IM_PRESENCE_GRACE_S={s['grace']}. The unwatched user's cycles and the 1:1 "
             f"sends (`{WATCHED}` on node 0 -> `{PEER}` on node {sd['to_node']}) are in the "
             "same run. Watchers subscribed in " + f"{fmt(r['setup_s'])} s.", ""]
    lines += md_table(["what", "n", "p50 / p99 ms", "max ms", "reached"], [
        _lat_row(f"login, {w:,} watchers: connect -> last watcher's online frame",
                 r["online_last"], _reached(r["online_reached_min"], w)),
        _lat_row(f"logout, {w:,} watchers: close -> last watcher's offline frame, "
                 f"minus the grace ({s['grace']} s)",
                 r["offline_last_minus_grace"], _reached(r["offline_reached_min"], w)),
        _lat_row(f"login, {w:,} watchers: connect -> pong", r["pong_watched"]),
        _lat_row("login, 0 watchers: connect -> pong", r["pong_unwatched"]),
        _lat_row("1:1 send: ack", sd["ack"], f"acked {sd['acked']}/{sd['sent']}"),
        _lat_row("1:1 send: delivery (push received)", sd["delivery"],
                 _reached(sd["delivered"], sd["acked"]))])
    lines += [f"Frames per watcher: duplicates {r['duplicates']}, other frames "
              f"{r['stray'] or 'none'}; send errors {sd['errors'] or 'none'}. "
              f"First (warm-up) login: last online frame after "
              f"{fmt(_ms(r['first_cycle'].get('online_last_s')))} ms.", ""]
    labels = {"watched_cycle": f"login + logout, {w:,} watchers",
              "unwatched_cycle": "login + logout, 0 watchers", "send": "1:1 send",
              "idle": "idle (watchers connected)"}
    lines += ["Node CPU per operation (a login + logout cycle, or a send); *net* subtracts "
              "the idle window's node CPU over the same length. " + TICK_NOTE, ""]
    lines += md_table(CPU_HEADER, _cpu_rows(r["cpu"], labels)) + _busiest(r["cpu"], labels)
    return lines


def typing_lines(res: dict[str, Any]) -> list[str]:
    r = res.get("typing", {})
    title = "2. Typing in a group"
    if "error" in r:
        return failed_lines(title, r)
    exp = r["expected_per_op"]
    lines = [f"## {title}", "",
             f"Group of {r['members']:,} members; **{r['online']:,} of them online** "
             f"({' / '.join(map(str, r['online_per_node']))} on nodes 0 / 1 / 2): typing "
             f"and group messages reach only the members online, never the sender's own "
             f"device, so each is expected by {exp:,} devices. {r['typers']} members take "
             f"turns, one operation every {fmt(r['gap_s'])} s; each waits until every "
             f"online member has it. Group created in {fmt(r['create_s'])} s, members "
             f"connected in {fmt(r['connect_s'])} s.", ""]
    lines += md_table(["what", "n", "p50 / p99 ms", "max ms", "reached (worst)"], [
        _lat_row("typing: sent -> last online member", r["typing_last"],
                 _reached(r["typing_reached_min"], exp)),
        _lat_row("group_send: ack", r["group_ack"],
                 f"acked {r['group_acked']}/{len(r['group_sends'])}"),
        _lat_row("group_send: sent -> last online member's group_msg", r["group_last"],
                 _reached(r["group_reached_min"], exp))])
    lines += [f"Duplicates {r['duplicates']}, frames back to the sender's own device "
              f"{r['self_echoes']}, other frames {r['stray'] or 'none'}.", ""]
    labels = {"typing": "typing", "group_send": "group_send", "idle": "idle (members online)"}
    lines += ["Node CPU per typing and per group message; *net* subtracts the idle window's "
              "node CPU over the same length. " + TICK_NOTE, ""]
    lines += md_table(CPU_HEADER, _cpu_rows(r["cpu"], labels)) + _busiest(r["cpu"], labels)
    return lines


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1000, 2)


def busy_note(res: dict[str, Any]) -> list[str]:
    hot = [f"{phase} {key} ({fmt(c['bench_cores'])} cores)"
           for phase in ("presence", "typing")
           for key, c in res.get(phase, {}).get("cpu", {}).items()
           if c["bench_cores"] >= BUSY_CORES]
    if not hot:
        return ["The benchmark process stayed below "
                f"{BUSY_CORES} of a core in every window.", ""]
    return [f"**The benchmark process was near a full core** in: {', '.join(hot)}. Its own "
            "reading of thousands of sockets is then part of the \"last watcher / member\" "
            "times: read them as an upper bound.", ""]


def render(res: dict[str, Any]) -> str:
    lines = header_lines("Chat-features benchmark: presence watchers and typing", res,
                         "; the 3 nodes, the benchmark, Redis, RabbitMQ and the store share "
                         "these CPUs")
    lines += [f"- namespace {res['namespace']}; 3 nodes, node defaults except "
              f"IM_PRESENCE_GRACE_S={res['settings']['grace']}; latencies are taken in "
              "this process's push handlers", ""]
    lines += presence_lines(res) + typing_lines(res) + busy_note(res)
    lines += ["## Node logs", ""] + node_lines(res.get("nodes", [])) + [""]
    return "\n".join(lines + [cleanup_line(res.get("cleanup", {}))])
