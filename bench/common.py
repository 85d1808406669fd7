"""Shared helpers for the benchmarks: timing, phases that fail alone,
machine facts, CPU accounting and measured windows (``Meter``, ``measure_window``),
node logs and metrics, py-spy profiles, result files, and child processes (both
sides: ``Child``; ``emit``, ``stdin_lines``).

Nodes, clients and cleanup come from ``testkit``; the chat load is ``bench/load.py``;
percentiles and histograms are ``bench/stats.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import re
import resource
import shutil
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson

from testkit.nemesis.store_load import top_commands

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "bench" / "out"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"  # the node's default (IM_AMQP_URL)
_CLK_TCK = os.sysconf("SC_CLK_TCK")
T = TypeVar("T")


def say(who: str, msg: str) -> None:
    """A progress line on stderr (stdout is for the report): ``[who] msg``."""
    print(f"[{who}] {msg}", file=sys.stderr, flush=True)


def utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


async def reported(job: Awaitable[dict[str, Any]], budget: float | None = None
                   ) -> dict[str, Any]:
    """A phase's result within ``budget`` s, or ``{"error": "<type>: <message>"}``: a
    failed phase is reported, and the phases after it still run."""
    try:
        async with asyncio.timeout(budget):
            return await job
    except Exception as exc:  # noqa: BLE001 - reported
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}


async def timed(job: Awaitable[T]) -> tuple[float, T]:
    """(seconds ``job`` took, its result)."""
    t = time.perf_counter()
    out = await job
    return time.perf_counter() - t, out


# -- machine -----------------------------------------------------------------
def machine_facts() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "kernel": platform.release(),
        "loadavg_at_start": os.getloadavg(),
    }


def code_version(tree: str | Path | None = None) -> dict[str, Any]:
    """The commit measured (of the nodes' ``tree``, default this checkout), and which
    tracked source files differed from it."""
    import subprocess

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=tree or REPO, capture_output=True,
                                  text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    status = git("--no-optional-locks", "status", "--porcelain", "--", "gateway", "router",
                 "store")
    changed = status.splitlines()
    return {"commit": git("rev-parse", "--short", "HEAD").strip(),
            "uncommitted_in_gateway_router_store": [line[3:] for line in changed],
            **({"node_tree": str(Path(tree).resolve())} if tree else {})}


# -- CPU accounting ------------------------------------------------------------
def _proc_ticks(pid: int) -> tuple[str, int] | None:
    """(short command line, utime + stime ticks) of one process, or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    argv = [a for a in raw.decode(errors="replace").split("\0") if a]
    if len(argv) > 1 and Path(argv[0]).name.startswith("python") and argv[1][0] != "-":
        argv = argv[1:]  # "python3 .venv/bin/secantusd-py ..." -> "secantusd-py ..."
    words = [Path(a).name if i == 0 else a for i, a in enumerate(argv[:4])]
    label = " ".join(" ".join(words).split())
    return (label or stat[stat.index("(") + 1:stat.rindex(")")])[:70], ticks


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs, from /proc/stat."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + parts[4]  # idle + iowait
    return sum(parts) - idle, sum(parts)


@dataclass
class CpuSnapshot:
    wall: float
    procs: dict[int, tuple[str, int]]
    machine: tuple[int, int]
    parents: dict[int, int] = field(default_factory=dict)  # pid -> its parent's pid


def cpu_snapshot() -> CpuSnapshot:
    procs: dict[int, tuple[str, int]] = {}
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (info := _proc_ticks(int(entry.name))) is not None:
            procs[int(entry.name)] = info
            parents[int(entry.name)] = _parent(int(entry.name))
    return CpuSnapshot(time.perf_counter(), procs, _machine_ticks(), parents)


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def cpu_report(before: CpuSnapshot, after: CpuSnapshot, names: dict[int, str],
               top: int = 6) -> dict[str, Any]:
    """CPU used between two snapshots, in cores (1.0 = one core busy all the time)."""
    wall = after.wall - before.wall
    used: list[tuple[float, int, str]] = []
    for pid, (label, ticks) in after.procs.items():
        start = before.procs.get(pid, (label, 0))[1]
        cores = (ticks - start) / _CLK_TCK / wall
        used.append((cores, pid, names.get(pid, label)))
    used.sort(reverse=True)
    busy = after.machine[0] - before.machine[0]
    total = after.machine[1] - before.machine[1]
    # A named node started with workers is a supervisor: its worker processes
    # (children running ``gateway serve``) do the work and count as its own.
    cores_of = {pid: c for c, pid, _ in used}
    for pid, parent in after.parents.items():
        if parent in names and pid not in names \
                and after.procs.get(pid, ("", 0))[0].endswith("gateway serve"):
            cores_of[parent] = cores_of.get(parent, 0.0) + cores_of.get(pid, 0.0)
    return {
        "machine_busy_pct": round(100 * busy / total, 1) if total else None,
        "by_pid": {str(pid): round(cores_of[pid], 3) for pid in names if pid in cores_of},
        "top": [{"pid": pid, "what": label, "cores": round(c, 3)}
                for c, pid, label in used[:top] if c > 0],
    }


def own_cpu() -> float:
    """CPU seconds this process used so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


@dataclass
class Meter:
    """CPU of every process (from /proc) and of this one (getrusage) from now until ``stop``."""

    names: dict[int, str]
    top: int = 6
    snap: CpuSnapshot = field(default_factory=cpu_snapshot)
    own: float = field(default_factory=own_cpu)

    def stop(self) -> tuple[float, dict[str, Any]]:
        """(seconds, ``cpu_report`` with ``load_generator_cores``: this process)."""
        after = cpu_snapshot()
        seconds = after.wall - self.snap.wall
        report = cpu_report(self.snap, after, self.names, self.top)
        report["load_generator_cores"] = round((own_cpu() - self.own) / seconds, 3)
        return seconds, report


def ms_per_op(seconds: float, report: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """CPU milliseconds per operation of ``report``'s busiest processes (``n`` operations)."""
    return [{"what": p["what"], "pid": p["pid"],
             "ms_per_op": round(p["cores"] * seconds * 1000 / n, 3)} for p in report["top"]]


async def measure_window(names: dict[int, str], nodes: Sequence[Any], opens_at: float,
                         closes_at: float, gate: Callable[[bool], None],
                         clock: Callable[[], float] = time.perf_counter, top: int = 6
                         ) -> tuple[float, dict[str, Any], list[dict[str, Any]]]:
    """A measured window from ``opens_at`` to ``closes_at`` (instants of ``clock``):
    ``gate(True)`` at the start, ``gate(False)`` at the end; (seconds, the CPU of every
    process over it, each node's ``metrics_delta`` over it)."""
    await asyncio.sleep(max(0.0, opens_at - clock()))
    before = await asyncio.gather(*(fetch_metrics(n.http_url) for n in nodes))
    meter = Meter(names, top)
    gate(True)
    await asyncio.sleep(max(0.0, closes_at - clock()))
    gate(False)
    seconds, cpu = meter.stop()
    after = await asyncio.gather(*(fetch_metrics(n.http_url) for n in nodes))
    return seconds, cpu, [metrics_delta(b, a) for b, a in zip(before, after, strict=True)]


def tcp_sockets() -> list[tuple[int, str, str]]:
    """(local port, state as in /proc: "0A" is LISTEN, inode) of every TCP socket of this
    machine, from ``/proc/net/tcp`` and ``tcp6``."""
    out: list[tuple[int, str, str]] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                if len(f := line.split()) > 9:
                    out.append((int(f[1].rsplit(":", 1)[1], 16), f[3], f[9]))
    return out


# -- node logs -----------------------------------------------------------------
def log_findings(path: Path, limit: int = 8) -> dict[str, Any]:
    """WARNING/ERROR lines of a node log: counts and the most frequent messages."""
    if not path.exists():
        return {"warnings": 0, "errors": 0, "top": []}
    levels: Counter[str] = Counter()
    messages: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"\S+ \S+ (WARNING|ERROR|CRITICAL) (\S+) (.*)", line)
        if m:
            levels[m.group(1)] += 1
            messages[f"{m.group(1)} {m.group(2)}: {_log_shape(m.group(3))}"] += 1
        elif line.startswith(("Traceback", "Exception")):
            levels["traceback"] += 1
    return {"warnings": levels["WARNING"], "errors": levels["ERROR"] + levels["CRITICAL"],
            "tracebacks": levels["traceback"],
            "top": [{"count": n, "line": msg[:200]} for msg, n in messages.most_common(limit)]}


def _log_shape(message: str) -> str:
    """A log message with what varies per line (hex ids, user ids) starred out,
    so lines of one kind are counted together."""
    message = re.sub(r"\b(for|user) \S+?:", r"\1 *:", message)
    return re.sub(r"[0-9a-f]{10}", "*", message)


# -- py-spy --------------------------------------------------------------------
def py_spy_path() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


def py_spy_later(pid: int, seconds: int, out: Path, delay: float = 0.0
                 ) -> asyncio.Task[dict[str, Any]]:
    """``py_spy_record`` in a task, starting ``delay`` s from now."""
    async def later() -> dict[str, Any]:
        await asyncio.sleep(delay)
        return await py_spy_record(pid, seconds, out)

    return asyncio.create_task(later())


async def py_spy_record(pid: int, seconds: int, out: Path, rate: int = 100) -> dict[str, Any]:
    """Sample ``pid`` for ``seconds`` (non-blocking) and summarise the raw stacks."""
    exe = py_spy_path()
    if exe is None:
        return {"skipped": "py-spy not installed"}
    proc = await asyncio.create_subprocess_exec(
        exe, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", str(rate),
        "--nonblocking", "--format", "raw", "--output", str(out),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), seconds + 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return {"skipped": "py-spy did not finish"}
    if proc.returncode != 0:
        return {"skipped": f"py-spy failed: {err.decode(errors='replace')[-300:]}"}
    return await asyncio.to_thread(summarise_stacks, out, seconds * rate)


def summarise_stacks(path: Path, expected: int, top: int = 15) -> dict[str, Any]:
    """Self (leaf) and inclusive sample counts per function from folded stacks."""
    if not path.exists():
        return {"skipped": f"no profile written to {path}"}
    leaf: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame_name(f) for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        leaf[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    def pct(n: int) -> float:
        return round(100 * n / total, 1) if total else 0.0
    useful = [(f, n) for f, n in inclusive.most_common() if not f.endswith(_ENTRY_FRAMES)]
    return {
        "samples": total, "expected_if_always_busy": expected, "raw_file": str(path),
        "self": [{"pct": pct(n), "fn": _LOOP_NOTE.get(f, f)} for f, n in leaf.most_common(top)],
        "inclusive": [{"pct": pct(n), "fn": f} for f, n in useful[:top]],
    }


# Frames every stack starts with; left out of the inclusive list.
_ENTRY_FRAMES = ("(<frozen runpy>)", "(gateway/__main__.py)", "(uvloop/__init__.py)",
                 "Runner.run (asyncio/runners.py)")
# With uvloop the loop's own work (polling, socket I/O, callbacks) is C code that
# py-spy attributes to the innermost Python frame: Runner.run.
_LOOP_NOTE = {"Runner.run (asyncio/runners.py)":
              "Runner.run (asyncio/runners.py) = uvloop C code: I/O, polling, scheduling"}


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file.py)``; line numbers merged."""
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame)
    if not m:
        return frame
    path = m.group(2)
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{m.group(1)} ({short})"


# -- node metrics ----------------------------------------------------------------
_METRIC = re.compile(r"^(im_\w+?)(\{[^}]*\})? ([0-9.eE+-]+)$")


async def fetch_metrics(http_url: str) -> dict[str, float]:
    """The node's ``im_*`` Prometheus samples (name{labels} -> value); {} on failure."""
    try:
        async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
            text = (await client.get(f"{http_url}/metrics")).text
    except httpx.HTTPError:
        return {}
    return {m.group(1) + (m.group(2) or ""): float(m.group(3))
            for line in text.splitlines() if (m := _METRIC.match(line))}


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Mean store batch size per stage and the nonzero counters, over a window."""
    diff = {k: v - before.get(k, 0.0) for k, v in after.items()}
    batches: dict[str, float] = {}
    for key, count in diff.items():
        m = re.match(r'im_store_batch_size_count\{stage="(\w+)"\}', key)
        if m and count > 0:
            total = diff.get(f'im_store_batch_size_sum{{stage="{m.group(1)}"}}', 0.0)
            batches[m.group(1)] = round(total / count, 1)
    counters = {k: int(v) for k, v in diff.items() if v and "_total" in k}
    return {"mean_batch_size": batches, "counters": counters,
            "histograms": histogram_quantiles(diff)}


_COMMAND = re.compile(r'im_store_command_seconds_sum\{(.*)\}')


def store_time(before: dict[str, float], after: dict[str, float], top: int = 10
               ) -> list[dict[str, Any]]:
    """The MongoDB commands a node spent the most time waiting on over a window
    (``im_store_command_seconds``): labels, count, total and mean seconds."""
    series: dict[str, tuple[float, float]] = {}
    for key, total in after.items():
        if (m := _COMMAND.match(key)) is not None:
            count_key = "im_store_command_seconds_count{" + m.group(1) + "}"
            series[m.group(1)] = (total - before.get(key, 0.0),
                                  after.get(count_key, 0.0) - before.get(count_key, 0.0))
    return top_commands(series, top)


_BUCKET = re.compile(r'(\w+)_bucket\{(.*)\}')
_LE = re.compile(r',?le="([^"]+)",?')


def histogram_quantiles(diff: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Per histogram series with observations in the window: count, and the upper
    bounds (s) of the buckets holding its p50 and p99 (Prometheus-style, coarse)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for key, v in diff.items():
        if (m := _BUCKET.match(key)) is not None and (le := _LE.search(m.group(2))):
            labels = (m.group(2)[:le.start()] + "," + m.group(2)[le.end():]).strip(",")
            name = m.group(1) + (f"{{{labels}}}" if labels else "")
            series.setdefault(name, []).append((float(le.group(1)), v))
    out: dict[str, dict[str, Any]] = {}
    for name, buckets in series.items():
        buckets.sort()
        total = buckets[-1][1] if buckets else 0
        if total <= 0:
            continue
        q: dict[str, Any] = {"count": int(total)}
        for p in (50, 99):
            q[f"p{p}_le"] = next(le for le, c in buckets if c >= total * p / 100)
        out[name] = q
    return out


# -- results -------------------------------------------------------------------
def write_json(results: dict[str, Any], stamp: str, prefix: str = "chat") -> Path:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{prefix}-{stamp}.json"
    path.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    return path


# -- event loop ------------------------------------------------------------------
def run_loop(coro: Any) -> Any:
    """Run ``coro`` on uvloop when installed (as the node does), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


# -- child processes -------------------------------------------------------------------
def emit(obj: dict[str, Any]) -> None:
    """A child's answer: one JSON line on stdout."""
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS) + b"\n")
    sys.stdout.flush()


async def stdin_lines() -> AsyncIterator[bytes]:
    """A child's commands: the lines of its stdin, until EOF (the benchmark went away)."""
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        yield line


def split(n: int, k: int) -> list[int]:
    """``n`` shared out over ``k`` as evenly as can be (the first ones get one more)."""
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


async def ask_all(children: Sequence[Child], cmds: Sequence[str | dict[str, Any]],
                  timeout: float) -> list[dict[str, Any]]:
    """``cmds[i]`` to ``children[i]``, all at once; their answers."""
    return list(await asyncio.gather(*(c.ask(cmd, timeout) for c, cmd in
                                       zip(children, cmds, strict=True))))


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (children inherit it); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


class Child:
    """``python -m <module> ...`` of this repository (subscribers, idle clients,
    baseline servers), driven by lines over its stdin and stdout; stderr goes to
    ``log_path``. EOF on its stdin tells it to stop."""

    def __init__(self, proc: asyncio.subprocess.Process, log_path: Path) -> None:
        self.proc, self.log_path = proc, log_path

    @classmethod
    async def spawn(cls, log_path: Path, *argv: str, **env: str) -> Child:
        with open(log_path, "ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", *argv, cwd=REPO, env={**os.environ, **env},
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err)
        return cls(proc, log_path)

    @classmethod
    async def server(cls, log_path: Path, *argv: str) -> tuple[Child, str]:
        """A server (``bench.room_baselines``) that prints ``READY <url>`` once it
        listens: (the child, that URL)."""
        child = await cls.spawn(log_path, *argv)
        try:
            line = (await child.readline()).decode()
            if not line.startswith("READY "):
                raise RuntimeError(f"{' '.join(argv)} did not start: {child.tail()}")
        except BaseException:
            await child.stop()
            raise
        return child, line.split()[1]

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def readline(self, timeout: float = 30) -> bytes:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            raise RuntimeError(f"{self.log_path.stem} (pid {self.pid}) exited: {self.tail()}")
        return line

    async def ask(self, cmd: str | dict[str, Any] | None, timeout: float = 30) -> dict[str, Any]:
        """Send ``cmd`` (a line, or JSON; None: nothing) and read one JSON line back."""
        assert self.proc.stdin is not None
        if cmd is not None:
            self.proc.stdin.write((cmd.encode() if isinstance(cmd, str) else orjson.dumps(cmd))
                                  + b"\n")
            await self.proc.stdin.drain()
        answer: dict[str, Any] = orjson.loads(await self.readline(timeout))
        return answer

    async def stop(self, quit_cmd: str | dict[str, Any] | None = None,
                   grace_s: float = 10) -> int | None:
        """``quit_cmd`` (answer awaited, bounded), EOF, SIGTERM after ``grace_s``, then
        SIGKILL; returns the exit code."""
        if self.proc.returncode is None:
            if quit_cmd is not None:
                with contextlib.suppress(Exception):
                    await self.ask(quit_cmd, 5)
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            for stop in (self.proc.terminate, self.proc.kill):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.proc.wait(), grace_s)
                    break
                with contextlib.suppress(ProcessLookupError):
                    stop()
            await self.proc.wait()
        return self.proc.returncode

    def tail(self, chars: int = 600) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]
