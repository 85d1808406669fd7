"""A fault schedule ("nemesis") run against a small cluster, and a checker of
the delivery guarantees of docs/protocol.md: ``await Nemesis(cfg).run()``
returns the report; ``summary`` gives its counts, ``MUST_BE_ZERO`` names those
that must be zero.

The parts:

- ``schedule``: the faults and when (``Fault``, ``ci_schedule``, ``long_schedule``);
- ``config``: ``NemesisConfig``;
- ``cluster``: the node processes, the private Redis and store, the broker proxies;
- ``faults``: each fault applied and healed, with the evidence it took effect;
- ``workload``: the users' SDK clients, their traffic, every frame they got;
- ``history``: what was recorded (``User``, ``Send``, ``Conn``, ``History``);
- ``checks``, ``room_checks``, ``unread_checks``: the rules, pure functions of
  the history (``lost``, ``duplicated``, ``reordered``, ``double_acked``,
  ``history_missing``, ``deaf_pushes``, ``silent_gaps``, ``unread_wrong``;
  per fault its acks during and after and its heal time);
- ``readback``: what the checker reads back from the cluster after the run.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from testkit.nemesis import checks, readback, room_checks, unread_checks
from testkit.nemesis.cluster import Cluster
from testkit.nemesis.config import NemesisConfig
from testkit.nemesis.faults import FaultInjector
from testkit.nemesis.history import History, now
from testkit.nemesis.schedule import Fault, ci_schedule, long_schedule
from testkit.nemesis.store_load import StoreLoad
from testkit.nemesis.workload import Workload

__all__ = ["MUST_BE_ZERO", "Fault", "Nemesis", "NemesisConfig", "ci_schedule", "dump",
           "long_schedule", "summary"]

MUST_BE_ZERO = ("lost", "duplicated", "reordered", "silent_gaps", "deaf_pushes",
                "double_acked", "unread_wrong", "history_missing", "history_duplicated",
                "stored_duplicated", "sdk_undelivered")


class Nemesis:
    """One run: ``await Nemesis(cfg).run()`` returns the report (a dict)."""

    def __init__(self, cfg: NemesisConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.cluster = Cluster(cfg)
        self.injector = FaultInjector(self.cluster)
        self.workload = Workload(cfg, self.cluster, self.rng)
        self._load: list[dict[str, Any]] | None = None
        self.store_load = StoreLoad(lambda: [(sl.running.pid, sl.http_url)
                                             for sl in self.cluster.live_slots()])
        self.t0 = 0.0

    @property
    def history(self) -> History:
        w = self.workload
        return History(w.users, w.probes, w.group_members, self.cfg.schedule, self.t0)

    async def run(self) -> dict[str, Any]:
        started = time.monotonic()
        try:
            await self.cluster.start()
            await self._set_up_clients()
            report = await self._traffic_and_check()
        finally:
            await self._store_load()  # printed also when the run stopped early
            await self.workload.close_all()
            await self.cluster.stop()
        report["duration_s"] = round(time.monotonic() - started, 1)
        return report

    async def _store_load(self) -> list[dict[str, Any]]:
        """What the nodes waited on MongoDB for, printed the first time."""
        if self._load is None:
            self._load = await self.store_load.stop()
            print("store commands by time waited (all node processes):",
                  *(f"  {r['seconds']:8.1f} s {r['count']:8d} x {r['mean_ms']:8.1f} ms  "
                    f"{r['command']}" for r in self._load), sep="\n", file=sys.stderr)
            print("sync cursor ages by source (all node processes):",
                  self.store_load.sync_ages(), file=sys.stderr)
        return self._load

    async def _set_up_clients(self) -> None:
        self.workload.make_users()
        await self.workload.connect_all()
        await self.workload.make_groups()
        await self.workload.join_room()

    async def _traffic_and_check(self) -> dict[str, Any]:
        self.t0 = now()
        self.workload.start_traffic()
        self.store_load.start()
        await self.injector.run_schedule(self.cfg.schedule, self.t0)
        left = self.t0 + self.cfg.seconds - now()
        if left > 0:
            await asyncio.sleep(left)
        t_stop = now()
        cancelled = await self.workload.stop_traffic()
        report = await self.check()
        report["store_commands"] = await self._store_load()
        report["sync_cursor_ages"] = self.store_load.sync_ages()
        report["pumps_cancelled"] = cancelled
        report["traffic_s"] = round(t_stop - self.t0, 1)
        return report

    async def check(self) -> dict[str, Any]:
        """After a settle period and a full sync of every user: the report, with
        the seconds each part of the check took (``check_s``)."""
        h = self.history
        laps = _Laps()
        left = await readback.settle(h, self.cfg.settle_s)
        laps("settle")
        since = await readback.final_sync(h)
        laps("final_sync")
        out: dict[str, Any] = {"namespace": self.cluster.ns, "seed": self.cfg.seed,
                               "tree": str(self.cfg.tree or "this checkout"),
                               "settle_left": left, "final_sync_since": since,
                               # acked, stored, but never given to the app by its SDK
                               # (push or sync) while it stayed connected
                               "sdk_undelivered": left["undelivered"]}
        out.update(_traffic_counts(h))
        out.update(checks.check_messages(h))
        out.update(checks.check_stored(await readback.stored_copies(self.cluster.mongo_url,
                                                                    self.cluster.ns)))
        laps("messages")
        held = await readback.group_history_held(h)
        laps("group_history_read")
        out.update(checks.check_group_history(h, held))
        out.update(checks.check_deaf(h))
        laps("group_history_and_deaf")
        out.update(await self._check_rooms(h))
        laps("rooms")
        out.update(await self._check_unread(h))
        laps("unread")
        out["faults"] = checks.fault_report(h)
        out["node_code"] = sorted(self.cluster.node_code)
        out["churned"] = len(self.workload.churned)
        out["connects_during_faults"] = checks.connects_during_faults(h)
        out["reconnects"] = sum(max(0, u.client.connects - 1) for u in h.everyone)
        out["duplicate_pushes"] = checks.duplicate_pushes(h)
        laps("faults")
        out["check_s"] = laps.took
        return out

    async def _check_rooms(self, h: History) -> dict[str, Any]:
        silent, streams = room_checks.silent_room_gaps(h)
        room = self.workload.room
        final = await readback.room_final(self.cluster.live_slots()[0].ws_url, room)
        silent += room_checks.tail_gaps(await readback.members_behind(h, room, final), final)
        return room_checks.room_report(h, silent, streams, final)

    async def _check_unread(self, h: History) -> dict[str, Any]:
        counters = await readback.group_counters(self.cluster.mongo_url, self.cluster.ns,
                                                 list(h.group_members))
        plans = unread_checks.plan_unread(h, self.rng, counters)
        return unread_checks.unread_report(await readback.read_and_list(plans))


class _Laps:
    """Seconds per named part, each from the end of the one before."""

    def __init__(self) -> None:
        self.took: dict[str, float] = {}
        self._t = time.monotonic()

    def __call__(self, name: str) -> None:
        t = time.monotonic()
        self.took[name] = round(t - self._t, 2)
        self._t = t


def _traffic_counts(h: History) -> dict[str, Any]:
    acked = [s for u in h.everyone for s in u.sends.values() if s.mid is not None]
    return {"acked": len(acked),
            "acked_dm": sum(1 for s in acked if s.kind == "dm"),
            "acked_group": sum(1 for s in acked if s.kind == "group"),
            "unacked": sum(1 for u in h.everyone for s in u.sends.values() if s.mid is None),
            "room_sends_ok": sum(len(u.room_ok) for u in h.everyone),
            "room_send_errors": dict(sum((u.room_errors for u in h.everyone), Counter()))}


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The counts: ``acked``, those that must be zero, and each fault's heal time."""
    out = {k: report.get(k) for k in ("acked", *MUST_BE_ZERO)}
    out["heal_s"] = {f"{f['kind']}@{f['at_s']}": f["heal_s"] for f in report["faults"]}
    return out


def dump(report: dict[str, Any], path: Path) -> None:
    """The whole report as JSON at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))
