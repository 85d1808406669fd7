"""``bench.room_client``'s subscriber process in C (``bench/room_client_c/room_client.c``),
for ``bench.room_bench --client-impl c``: same flags, same JSON lines on stdin and
stdout, kinds ``ours`` and ``ws`` only (socket.io keeps the Python client).

This shim parses the flags, computes every socket's request target as
``bench.room_client`` does (``conn_path``, the token secret in ``ROOM_BENCH_SECRET``;
socket ``g`` to ``urls[g % n]``, sampled iff ``g % sample_every == 0``), writes them to
a temporary file (one line per socket: url index, host, port, path, sampled), builds
the C program if its cached binary (``/tmp/imgate-room-client-<sha256 of the source
and flags>``) is missing, then ``exec``s it: the pid the benchmark meters is the C
process. A build error is printed on stderr and answered as ``{"ev": "failed"}``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from bench.common import emit
from bench.room_client import conn_path, parse_args

SOURCE = Path(__file__).with_name("room_client_c") / "room_client.c"
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra"]
KINDS = ("ours", "ws")


def binary() -> Path:
    """The compiled program, built (atomically: several processes may start at once)
    unless a binary of this very source and these flags is cached."""
    src = SOURCE.read_bytes()
    key = hashlib.sha256(src + " ".join(CFLAGS).encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"imgate-room-client-{key}"
    if out.exists():
        return out
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    cc = os.environ.get("CC", "gcc")
    r = subprocess.run([cc, *CFLAGS, "-o", str(tmp), str(SOURCE), "-lm"], capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0 or r.stderr.strip():  # warnings count as errors: keep it clean
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"{cc} {' '.join(CFLAGS)} {SOURCE} failed (exit {r.returncode}):\n"
                           f"{r.stderr.strip()}")
    os.replace(tmp, out)
    return out


def main() -> None:
    args = parse_args("bench.room_client_c", __doc__, KINDS, ("--poll-us", 0))
    urls = args.urls.split(",")
    secret = os.environ.get("ROOM_BENCH_SECRET", "")

    lines = []
    for g in range(args.first, args.first + args.count):
        i = g % len(urls)
        u = urlsplit(urls[i])
        path = conn_path(args.kind, urls[i], f"{args.tag}-s{g}", secret)
        if any(ch.isspace() for ch in path):
            raise SystemExit(f"request target with white space: {path!r}")
        lines.append(f"{i} {u.hostname or '127.0.0.1'} {u.port or 80} {path} "
                     f"{int(g % args.sample_every == 0)}\n")
    try:
        exe = binary()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(exc, file=sys.stderr, flush=True)
        emit({"ev": "failed", "error": f"room_client.c did not build: {exc}"[:2000], "other": {}})
        raise SystemExit(1) from None
    fd, name = tempfile.mkstemp(prefix="room-client-c-", suffix=".txt")
    with os.fdopen(fd, "w") as f:  # the C program deletes it once read
        f.writelines(lines)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [str(exe), "--file", name, "--kind", args.kind, "--n-urls", str(len(urls)),
                   "--concurrency", str(args.concurrency), "--max-seconds",
                   str(args.max_seconds), "--poll-us", str(args.poll_us)])


if __name__ == "__main__":
    main()
