"""Markdown for the benchmark reports: table cells and tables, the header every
report starts with, the sections both chat benchmarks print for a load phase
(rates, latencies, CPU, the node's counters) and for a py-spy profile, and one
line per node on what its log said.
"""

from __future__ import annotations

from typing import Any


def fmt(v: Any) -> str:
    """A table cell: thousands separators, one decimal from 10 up, "-" for None."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def lat(s: dict[str, Any], which: str = "p50 p99") -> str:
    """Latencies of a ``latency_summary``: ``lat(s, "p50 p99 max")`` -> "1.20 / 3.40 / 5.00"."""
    return " / ".join(fmt(s.get(f"{k}_ms")) for k in which.split())


def md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A markdown table (and a blank line after it), cells through ``fmt``."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return out + [""]


def header_lines(title: str, res: dict[str, Any], machine_note: str = "") -> list[str]:
    """Title, command line, machine and code version; ``machine_note`` ends the machine line."""
    m = res["machine"]
    return [f"# {title}", "", f"`{res['command']}`", "",
            f"- machine: {m['nproc']} CPUs, {m['cpu_model']}, Python {m['python']}, "
            f"kernel {m['kernel']}, load avg at start {m['loadavg_at_start'][0]:.2f}"
            + machine_note,
            f"- code: commit {res['code']['commit']}, uncommitted changes in "
            f"{len(res['code']['uncommitted_in_gateway_router_store'])} gateway/router/store "
            "files" + (f" (nodes run from {res['code']['node_tree']})"
                       if res["code"].get("node_tree") else "")]


def failed_lines(title: str, r: dict[str, Any]) -> list[str]:
    """A phase that failed (``common.reported``): its heading and the error; [] if it ran."""
    return [f"## {title}", "", f"**failed**: {r['error']}", ""] if "error" in r else []


def load_section(title: str, r: dict[str, Any]) -> list[str]:
    """One load phase (``bench.load.summarise``): rates, latencies, CPU, node counters."""
    a, d, lag = r["ack_latency"], r["delivery_latency"], r["send_lag"]
    rows = [["window (s)", r["seconds"]], ["sent/s", r["sent_per_s"]],
            ["acks/s", r["acks_per_s"]], ["deliveries/s", r["deliveries_per_s"]],
            ["errors", ", ".join(f"{k}={v}" for k, v in r["errors"].items()) or "none"],
            ["unanswered / undelivered after drain", f"{r['unanswered']} / {r['undelivered']}"],
            ["ack latency p50/p95/p99/max (ms)",
             lat(a, "p50 p95 p99 max")],
            ["delivery latency p50/p99/max (ms)",
             lat(d, "p50 p99 max")]]
    if "target_per_s" in r:
        rows.insert(1, ["target rate/s", r["target_per_s"]])
        rows.append(["send lag p99/max (ms)", f"{fmt(lag['p99_ms'])} / {fmt(lag['max_ms'])}"])
    rows += _cpu_rows(r["cpu"]) + _node_metric_rows(r["cpu"].get("node_metrics"))
    return [f"## {title}", ""] + md_table(["", "value"], rows)


def _node_metric_rows(nm: dict[str, Any] | None) -> list[list[Any]]:
    if not nm:
        return []
    batches = ", ".join(f"{k} {v}" for k, v in sorted(nm["mean_batch_size"].items()))
    wanted = ("im_sends_total", "im_errors_total", "im_push_skipped_total", "im_pushes_total")
    counters = ", ".join(f"{k.removeprefix('im_')}={v}" for k, v in nm["counters"].items()
                         if k.startswith(wanted))
    stages = "; ".join(
        f"{k.removeprefix('im_').replace('_seconds', '')} p50 <= {fmt(v['p50_le'] * 1000)}, "
        f"p99 <= {fmt(v['p99_le'] * 1000)}" for k, v in sorted(nm.get("histograms", {}).items())
        if k.startswith(("im_store_stage", "im_send_ack", "im_loop_lag")))
    return [["node: mean store batch size in window", batches or "-"],
            ["node: counters in window", counters or "-"],
            ["node: stage histograms in window (ms, bucket bounds)", stages or "-"]]


def _cpu_rows(cpu: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = [["machine CPU busy %", cpu["machine_busy_pct"]],
                             ["load generator CPU (cores)", cpu["load_generator_cores"]]]
    rows += [[f"CPU cores: {p['what']} (pid {p['pid']})", p["cores"]] for p in cpu["top"]]
    return rows


def profile_section(prof: dict[str, Any] | None) -> list[str]:
    """A node's py-spy summary (``common.summarise_stacks``): self and inclusive %."""
    if not prof:
        return []
    if "skipped" in prof:
        return [f"py-spy: {prof['skipped']}", ""]
    lines = [f"## Node profile (py-spy, {prof['samples']} samples of "
             f"{prof['expected_if_always_busy']} if always busy)", ""]
    rows = [[s["pct"], s["fn"], i["pct"], i["fn"]]
            for s, i in zip(prof["self"], prof["inclusive"], strict=False)]
    return lines + md_table(["self %", "function", "incl %", "function"], rows)


def node_lines(nodes: list[dict[str, Any]], trouble_only: bool = False) -> list[str]:
    """One line per node of ``cluster.Run.nodes``: exit code, what its log warned of
    (the three most frequent lines) and where the log is."""
    out = []
    for n in nodes:
        lf = n["log_findings"]
        if trouble_only and not (lf["warnings"] or lf["errors"] or lf["tracebacks"]
                                 or n["exit_code"]):
            continue
        top = "".join(f"; {t['count']}x {t['line'][:120]}" for t in lf["top"][:3])
        out.append(f"- node {n['name'] or '?'} exit {n['exit_code']}: {lf['warnings']} "
                   f"warnings, {lf['errors']} errors, {lf['tracebacks']} tracebacks{top} "
                   f"(`{n['log']}`)")
    return out


def cleanup_line(cleanup: dict[str, Any]) -> str:
    """``Cleanup: done``, or the namespaces whose cleanup failed in a step."""
    bad = {ns: d for ns, d in cleanup.items()
           if isinstance(d, dict) and any(isinstance(v, str) for v in d.values())}
    return f"Cleanup: {'done' if not bad else bad}"
