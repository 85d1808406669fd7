"""What tests read off a node from outside: a Prometheus sample, a process's RSS."""

from __future__ import annotations

__all__ = ["rss_kb", "sample"]


def sample(text: str | bytes, name: str) -> float:
    """The value of the sample ``name`` (with its labels, e.g.
    ``im_closed_total{reason="flood"}``) in Prometheus text; 0 if absent."""
    if isinstance(text, bytes):
        text = text.decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def rss_kb(pid: int) -> int:
    """VmRSS of ``pid`` in KiB (Linux ``/proc``)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
