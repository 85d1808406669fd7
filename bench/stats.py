"""The benchmarks' statistics, in one place: nearest-rank percentiles and latency
summaries of sample lists, counts merged key by key, and the log histogram the
client processes keep when a run has too many samples to ship (``bench.room_client``,
its C twin ``bench/room_client_c/room_client.c``, ``bench.many_clients``).

The log histogram: a latency of ``us`` microseconds falls in bucket
``int(ln(us) * LOG_BUCKETS)`` (0 for 1 us or less): 200 buckets per factor e, each
0.5 % wide. A percentile is reported as its bucket's midpoint (+-0.25 %).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

LOG_BUCKETS = 200  # histogram buckets per factor e of microseconds (0.5 % wide)


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an already sorted list (None when empty)."""
    if not sorted_values:
        return None
    rank = min(len(sorted_values), max(1, math.ceil(p / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


def latency_summary(samples: list[float], ps: tuple[float, ...] = (50, 95, 99),
                    mean: bool = False) -> dict[str, Any]:
    """Milliseconds: count, the given percentiles, max (and the mean)."""
    ordered = sorted(samples)
    out: dict[str, Any] = {"count": len(ordered)}
    for p in ps:
        v = percentile(ordered, p)
        out[f"p{p:g}_ms"] = None if v is None else round(v * 1000, 2)
    out["max_ms"] = round(ordered[-1] * 1000, 2) if ordered else None
    if mean:
        out["mean_ms"] = round(sum(ordered) / len(ordered) * 1000, 2) if ordered else None
    return out


def merge_counts(dicts: list[dict[Any, int]]) -> dict[Any, int]:
    """Counts summed key by key."""
    return dict(sum((Counter(d) for d in dicts), Counter()))


# -- the log histogram ---------------------------------------------------------------------
def bucket(seconds: float) -> int:
    """The log bucket of a latency."""
    us = seconds * 1e6
    return int(math.log(us) * LOG_BUCKETS) if us > 1 else 0


def bucket_mid(k: int) -> float:
    """The midpoint of bucket ``k``, in seconds."""
    return math.exp((k + 0.5) / LOG_BUCKETS) / 1e6


class LogHist:
    """A log histogram of seconds, its count and exact max."""

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.max = 0.0
        self.count = 0

    def add(self, seconds: float) -> None:
        i = bucket(seconds)
        self.buckets[i] = self.buckets.get(i, 0) + 1
        self.count += 1
        if seconds > self.max:
            self.max = seconds

    def report(self) -> dict[str, Any]:
        return {"hist": self.buckets, "max": self.max, "count": self.count}


def int_keys(hist: dict[Any, int]) -> dict[int, int]:
    """A histogram read back from JSON (its keys are strings)."""
    return {int(k): int(v) for k, v in hist.items()}


def merge_hists(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Merged ``LogHist.report()``s of several processes."""
    return {"hist": merge_counts([int_keys(p["hist"]) for p in parts]),
            "max": max((p["max"] for p in parts), default=0.0),
            "count": sum(p["count"] for p in parts)}


def hist_rank(hist: dict[int, int], rank: int) -> int:
    """The bucket holding the ``rank``-th smallest sample (1-based; clamped to the last)."""
    seen = 0
    for k in sorted(hist):
        seen += hist[k]
        if seen >= rank:
            return k
    return max(hist)


def hist_summary(hist: dict[int, int], max_s: float, clip: bool = False) -> dict[str, Any]:
    """count, p50 / p99 (ms, bucket midpoints: +-0.25 %; with ``clip`` never above the
    exact max) and the exact max of a (merged) histogram."""
    total = sum(hist.values())
    out: dict[str, Any] = {"count": total, "p50_ms": None, "p99_ms": None,
                           "max_ms": round(max_s * 1000, 2) if total else None}
    if total:
        for p in (50, 99):
            mid = bucket_mid(hist_rank(hist, max(1, math.ceil(p / 100 * total))))
            out[f"p{p}_ms"] = round((min(mid, max_s) if clip else mid) * 1000, 2)
    return out


def report_summary(report: dict[str, Any]) -> dict[str, Any]:
    """``hist_summary`` of a (merged) ``LogHist.report()``, clipped at its max."""
    return hist_summary(int_keys(report["hist"]), report["max"], clip=True)
