"""One hostile user at every cap at once, against one gateway node: how much
slower do other users get? It backs the acceptance criterion "with an attacker
at every cap at once (groups, presence watches, new conversations, typing,
receipts), another user's 1:1 send p50 stays within 1.5x of its baseline in the
same run, and the victim's sync, groups and conversations calls within 2x".

    .venv/bin/python -m bench.abuse            # 2,000 groups, 20 s phases (a few minutes)
    .venv/bin/python -m bench.abuse --quick    # 200 groups, 10 s phases

It starts ONE node (``python -m gateway serve``) in a fresh namespace of the local
Redis, RabbitMQ and MongoDB-compatible server (dropped at the end), with the
node's real per-connection and per-user budgets (``IM_SEND_RATE``, ``IM_OP_RATE``,
``IM_REFUSE_BURST``, ``IM_MAX_CONNS_PER_USER``, ``IM_HTTP_RATE`` at their
defaults) and every cap at its default but one: ``IM_GROUP_CREATES_PER_MIN`` is
raised (``--creates-per-min``) so that the attackers' groups can be made in
minutes rather than hours. The per-address limits are off (everything comes
from 127.0.0.1). Only 127.0.0.1; every loop and wait is bounded; it stops by
itself.

Who: a bystander pair (B1 sends 1:1 to B2; both connected, contacts both ways),
a victim V (connected; a few 1:1 conversations and a few small groups of its
own, with messages, so its sync and conversation list have real content), and
the attackers. Phases, each ``--seconds`` long, measuring the same calls:

1. **baseline**: B1 sends to B2 at ``--send-rate``/s, each waiting for its ack
   (ack latency; delivery to B2 too); V calls ``GET /v1/sync?since=0&limit=100``
   (``sync``: a new device's first page), ``GET /v1/sync`` from the cursor its
   last call answered (``sync_cursor``: a client keeping up; each phase starts
   at the head),
   ``GET /v1/groups`` and ``GET /v1/conversations?limit=50`` at ``--call-rate``/s
   each, one at a time.
2. (setup, not measured for harm; timed) ``ceil(groups / IM_MAX_GROUPS_OWNED)``
   attacker accounts create groups of ``--members`` members each: V, the main
   attacker (also a member of every other account's groups, so it sends into
   all of them) and fillers (ids never connected, distinct per group) until V
   is in ``--groups`` groups (its own included); groups over
   ``IM_GROUP_WRITE_DIFFUSION_MAX`` (100) members are read-diffused. Then one
   more create by a full owner (``IM_MAX_GROUPS_OWNED``) and one more group
   with V (``IM_MAX_GROUPS_JOINED``), to show those caps. The main attacker
   (one token, ``--attacker-conns`` WebSockets, default ``IM_MAX_CONNS_PER_USER``;
   one more handshake shows that cap) presence-subscribes ``--watches``
   distinct ids (at most ``IM_PRESENCE_SUBS_MAX`` per connection; with the default
   ``IM_PRIVACY_PRESENCE=contacts`` a stranger's presence is hidden and not
   watched, so each id costs a privacy check and the cap is never met) and starts
   ``--new-convs`` new 1:1 conversations (sends to never-seen ids), a few past
   ``IM_MAX_NEW_CONVS_PER_DAY``.
3. **caps_filled**: the same measurements, the attacker's state in place, the
   attacker quiet.
4. **attack**: the same measurements while the main attacker, in a separate
   process (so its work does not stall this process's clocks), keeps every
   budget full on every connection: ``group_send`` round-robin over its groups
   at ``IM_SEND_RATE`` (less one 1:1 send a second to a fresh stranger: new
   conversations past the day's cap), and the rest of ``IM_OP_RATE`` in
   ``typing`` to random strangers, ``read`` with random conv / mid, and
   presence re-subscriptions (500 fresh ids out, 500 in); and ``GET /v1/groups``
   and ``GET /v1/conversations`` at ``IM_HTTP_RATE``. Its answers are counted by
   code: the refusals show the caps at work. A connection the node closes is
   opened again. Each measured call waits for the one before, so a slow phase
   has few samples: look at ``n``.

Output: a JSON summary on stdout, a short table on stderr, every figure in
``bench/out/abuse-<UTC stamp>.json`` (the node's log beside it). Per call and
phase: n, p50, p99, max, errors, and the ratio of p50 to the baseline's; the
attacker's answers and achieved rates; setup time; CPU per process; this
process's event-loop lag (how far its own clocks can be trusted). The ratios
are figures, not assertions: the exit code is 1 only when the run broke.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from bench import cli, common, store_probe
from bench.abuse_attacker import (
    TEXT,
    Calls,
    Frame,
    attacker_child,
    loop_lag,
    paced,
)
from bench.cluster import Run, process_names
from bench.stats import latency_summary, percentile
from gateway.config import Settings
from testkit.device import Device, DeviceClosed
from testkit.http import HttpError, HttpUsers
from testkit.nodes import NodeProcess
from testkit.poll import bounded
from testkit.tokens import issue_token

VICTIM, B1, B2, MAIN = "victim", "by1", "by2", "atk0"
PEERS = [f"peer{i}" for i in range(5)]  # V's 1:1 conversations
OWN_GROUPS, OWN_GROUP_MSGS, DM_EACH_WAY = 3, 10, 4
CALL_TIMEOUT_S = 30.0  # one measured call
LEAD_S, TAIL_S = 1.0, 2.0  # the attack runs this long before and after the measured window
CREATE_RETRIES = 6
PHASES = ("baseline", "caps_filled", "attack")
CALLS = ("send", "sync", "sync_cursor", "groups", "conversations")
LIMITS = {"send": 1.5, "sync": 2.0, "sync_cursor": 2.0, "groups": 2.0,
          "conversations": 2.0}  # the criterion
# The node's real budgets (``Run.start_nodes`` lifts them for the other benchmarks).
REAL_BUDGETS = ("send_rate", "send_burst", "op_rate", "op_burst", "refuse_burst",
                "max_conns_per_user", "http_rate", "user_handshake_rate", "user_handshake_burst")
log = functools.partial(common.say, "abuse")


# -- the benchmark ----------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run = Run(args, "abuse")
        self.ns = self.run.namespace("")
        self.node: NodeProcess | None = None
        self.http: HttpUsers | None = None
        self.devices: dict[str, Device] = {}
        self.child: common.Child | None = None
        self.names: dict[int, str] = {}
        self.delivered: list[float] = []  # B2's delivery latencies, the current phase's
        self.own_groups: list[str] = []

    def node_settings(self) -> dict[str, Any]:
        real = {k: getattr(Settings, k) for k in REAL_BUDGETS}
        return {**real, "group_creates_per_min": self.args.creates_per_min}

    async def start(self) -> None:
        self.node = (await self.run.start_nodes(self.ns, 1, "node", **self.node_settings()))[0]
        self.names = process_names([self.node])
        self.http = HttpUsers(self.node.http_url, self.run.secret, timeout=CALL_TIMEOUT_S,
                              limits=httpx.Limits(max_connections=32))

    async def open(self, user: str, on_push: Callable[[Frame], None]) -> Device:
        assert self.node is not None
        dev = await Device.open(self.node.ws_url, issue_token(self.run.secret, user, 4 * 3600),
                                on_push=on_push, open_timeout=15, max_size=1 << 22)
        self.devices[user] = dev
        return dev

    def on_b2(self, f: Frame) -> None:
        body = f.get("body") if f.get("op") == "msg" else None
        t = body.get("t") if isinstance(body, dict) else None
        if isinstance(t, float):
            self.delivered.append(time.perf_counter() - t)

    # -- content --------------------------------------------------------------------------
    async def content(self) -> dict[str, Any]:
        """B1, B2 and V connected; B1 and B2 contacts both ways; V's conversations."""
        t = time.perf_counter()
        b1 = await self.open(B1, lambda f: None)
        b2 = await self.open(B2, self.on_b2)
        v = await self.open(VICTIM, lambda f: None)
        ack(await b2.request("send", to=B1, cmid="hello", body=TEXT), "B2 -> B1")
        ack(await b1.request("send", to=B2, cmid="hello", body=TEXT), "B1 -> B2")
        for p in PEERS:
            dev = await self.open(p, lambda f: None)
            for j in range(DM_EACH_WAY):
                ack(await v.request("send", to=p, cmid=f"{p}-v{j}", body=TEXT), "V -> peer")
                ack(await dev.request("send", to=VICTIM, cmid=f"v{j}", body=TEXT), "peer -> V")
            await dev.close()
            del self.devices[p]
        assert self.http is not None
        for k in range(OWN_GROUPS):
            g = (await self.http[VICTIM].ok("POST", "/v1/groups", json={
                "name": f"V's group {k}", "members": [B1, B2, *PEERS[:2]]}))["group"]
            self.own_groups.append(g)
            for j in range(OWN_GROUP_MSGS):
                ack(await v.request("group_send", group=g, cmid=f"{g}-{j}", body=TEXT),
                    "V's group send")
        return {"seconds": round(time.perf_counter() - t, 2),
                "victim_msgs": len(PEERS) * 2 * DM_EACH_WAY + OWN_GROUPS * OWN_GROUP_MSGS,
                "victim_own_groups": OWN_GROUPS}

    async def warmup(self) -> None:
        """A few of each measured call, not measured (connections, caches)."""
        assert self.http is not None
        b1 = self.devices[B1]
        for i in range(10):
            ack(await b1.request("send", to=B2, cmid=f"warm-{i}", body={"t": 0, "text": TEXT}),
                "warm-up send")
        for _ in range(3):
            for path, params in (("/v1/sync", {"since": 0, "limit": 100}), ("/v1/groups", {}),
                                 ("/v1/conversations", {"limit": 50})):
                await self.http[VICTIM].ok("GET", path, params=params)

    # -- one measured phase -----------------------------------------------------------------
    async def phase(self, name: str, attack: bool) -> dict[str, Any]:
        a, http, node = self.args, self.http, self.node
        assert http is not None and node is not None
        calls = {c: Calls() for c in CALLS}
        delivered: list[float] = []
        self.delivered = delivered
        lag: list[float] = []
        job: asyncio.Task[dict[str, Any]] | None = None
        if attack:
            assert self.child is not None
            job = asyncio.create_task(self.child.ask(
                {"cmd": "attack", "seconds": LEAD_S + a.seconds + TAIL_S,
                 "scale": a.attack_scale}, a.seconds + 180))
            await asyncio.sleep(LEAD_S)
        b1, v = self.devices[B1], self.devices[VICTIM]
        v_pushes = Counter(v.counts)
        before = await common.fetch_metrics(node.http_url)
        meter = common.Meter(self.names, top=8)
        until = time.perf_counter() + a.seconds

        async def send(i: int) -> None:
            t = time.perf_counter()
            try:
                r = await b1.request("send", CALL_TIMEOUT_S, to=B2, cmid=f"{name}-{i}",
                                     body={"t": t, "text": TEXT})
            except (TimeoutError, DeviceClosed) as exc:
                calls["send"].errors[type(exc).__name__] += 1
                return
            if r.get("op") == "ack":
                calls["send"].lat.append(time.perf_counter() - t)
            else:
                calls["send"].errors[str(r.get("code"))] += 1

        async def get(call: str, path: str, params: dict[str, Any], i: int) -> None:
            t = time.perf_counter()
            try:
                r = await http[VICTIM].get(path, params=params)
            except httpx.HTTPError as exc:
                calls[call].errors[type(exc).__name__] += 1
                return
            if r.status_code == 200:
                calls[call].lat.append(time.perf_counter() - t)
            else:
                calls[call].errors[str(r.status_code)] += 1

        async def sync_on(i: int) -> None:
            """A client's sync: from where its last one ended."""
            t = time.perf_counter()
            try:
                r = await http[VICTIM].get("/v1/sync", params={"since": cursor[0],
                                                               "limit": 100})
            except httpx.HTTPError as exc:
                calls["sync_cursor"].errors[type(exc).__name__] += 1
                return
            if r.status_code == 200:
                calls["sync_cursor"].lat.append(time.perf_counter() - t)
                cursor[0] = max(cursor[0], int(r.json()["next"]))
            else:
                calls["sync_cursor"].errors[str(r.status_code)] += 1

        cursor = [await self.sync_head()]  # untimed: the phase starts at the head
        try:
            await asyncio.gather(
                paced(a.send_rate, until, send),
                paced(a.call_rate, until, sync_on),
                paced(a.call_rate, until, functools.partial(
                    get, "sync", "/v1/sync", {"since": 0, "limit": 100})),
                paced(a.call_rate, until, functools.partial(get, "groups", "/v1/groups", {})),
                paced(a.call_rate, until, functools.partial(
                    get, "conversations", "/v1/conversations", {"limit": 50})),
                loop_lag(until, lag))
        except BaseException:
            if job is not None:
                job.cancel()
            raise
        seconds, cpu = meter.stop()
        after = await common.fetch_metrics(node.http_url)
        res: dict[str, Any] = {
            "seconds": round(seconds, 2), "calls": {c: calls[c].summary() for c in CALLS},
            "delivery_b1_b2": latency_summary(delivered, (50, 99)),
            "victim_pushes": dict(Counter(v.counts) - v_pushes),
            "loop_lag_ms": lag_summary(lag), "cpu": cpu,
            "node_counters": common.metrics_delta(before, after)["counters"],
            "store_commands": common.store_time(before, after)}
        if job is not None:
            res["attacker"] = await job
            if "error" in res["attacker"]:
                raise RuntimeError(f"attacker: {res['attacker']['error']}")
        log(f"{name}: " + ", ".join(f"{c} p50 {res['calls'][c]['p50_ms']} ms"
                                    for c in CALLS))
        return res

    async def sync_head(self) -> int:
        """The victim's sync cursor at the head of its messages now."""
        assert self.http is not None
        since = 0
        for _ in range(10_000):
            page = (await self.http[VICTIM].get("/v1/sync", params={
                "since": since, "limit": 200})).json()
            since = max(since, int(page["next"]))
            if not page["more"]:
                break
        return since

    # -- the attackers' setup ------------------------------------------------------------------
    async def setup_attack(self) -> dict[str, Any]:
        a, http, node = self.args, self.http, self.node
        assert http is not None and node is not None
        t0 = time.perf_counter()
        n = max(0, a.groups - OWN_GROUPS)
        owned = int(Settings.max_groups_owned)
        refused_v = Counter[str]()
        codes = Counter[str]()

        async def create(k: int) -> str | None:
            owner = f"atk{k // owned}"
            head = [VICTIM] + ([MAIN] if owner != MAIN else [])
            fillers = [f"f{k}x{j}" for j in range(a.members - 1 - len(head))]
            for attempt in range(CREATE_RETRIES):
                r = await http[owner].post("/v1/groups", json={
                    "name": f"spam {k}", "members": head + fillers})
                codes[str(r.status_code)] += 1
                if r.status_code == 200:
                    body = r.json()
                    refused_v["victim refused" if VICTIM in body["refused"] else "victim in"] += 1
                    return str(body["group"])
                if r.status_code not in (429, 503) or attempt == CREATE_RETRIES - 1:
                    raise HttpError(r)
                await asyncio.sleep(0.5 * 2 ** attempt)
            return None

        done = [0]

        async def counted(k: int) -> str | None:
            g = await create(k)
            done[0] += 1
            if done[0] % 250 == 0:
                log(f"setup: {done[0]}/{n} groups in {time.perf_counter() - t0:.0f} s")
            return g

        groups = await bounded((counted(k) for k in range(n)), a.setup_concurrency)
        groups_s = time.perf_counter() - t0
        log(f"setup: {n} groups of {a.members} in {groups_s:.1f} s")
        # The caps: one more group by a full owner, one more group with V.
        probes: dict[str, Any] = {}
        if n >= owned:
            r = await http[MAIN].post("/v1/groups", json={"name": "one more",
                                                          "members": ["f-probe"]})
            probes["owner_past_max_groups_owned"] = f"{r.status_code} {r.text[:160]}"
        r = await http["atkx"].post("/v1/groups", json={"name": "one more", "members": [VICTIM]})
        probes["victim_in_one_more_group"] = (
            f"{r.status_code} refused={r.json().get('refused')}" if r.status_code == 200
            else f"{r.status_code} {r.text[:160]}")
        v_groups = await count_groups(http, VICTIM)
        # The main attacker: its connections, watches and new conversations.
        t1 = time.perf_counter()
        self.child = await common.Child.spawn(
            common.OUT_DIR / f"abuse-{a.stamp}-attacker.log", "bench.abuse", "--attacker-child")
        self.names[self.child.pid] = "attacker (child process)"
        opened = await self.child.ask({
            "cmd": "open", "ws_url": node.ws_url, "http_url": node.http_url,
            "secret": self.run.secret, "user": MAIN, "conns": a.attacker_conns,
            "send_rate": Settings.send_rate, "op_rate": Settings.op_rate,
            "http_rate": Settings.http_rate, "max_inflight": Settings.max_inflight}, 120)
        if "error" in opened:
            raise RuntimeError(f"attacker open: {opened['error']}")
        state = await self.child.ask({"cmd": "setup", "watches": a.watches,
                                      "new_convs": a.new_convs, "extra": a.past_cap}, 600)
        if "error" in state:
            raise RuntimeError(f"attacker setup: {state['error']}")
        log(f"setup: attacker {opened}, {state}")
        return {"groups_created": sum(g is not None for g in groups), "members": a.members,
                "owners": math.ceil(n / owned) if n else 0, "create_answers": dict(codes),
                "victim_in_created": dict(refused_v), "groups_s": round(groups_s, 1),
                "victim_groups": v_groups, "cap_probes": probes, "attacker": opened,
                "attacker_state": state, "attacker_s": round(time.perf_counter() - t1, 1),
                "total_s": round(time.perf_counter() - t0, 1)}

    async def close(self) -> dict[str, Any]:
        """Stop everything started (each step runs even if one before failed)."""
        async def child() -> None:
            if self.child is not None:
                log(f"attacker child exited with {await self.child.stop(grace_s=30)}")

        async def clients() -> None:
            await asyncio.gather(*(d.close() for d in self.devices.values()),
                                 return_exceptions=True)
            if self.http is not None:
                await self.http.aclose()

        async def node() -> None:
            if self.node is not None:
                await self.run.stop_nodes([self.node])

        for step in (child, clients, node):
            try:
                await step()
            except Exception as exc:  # noqa: BLE001 - the next steps still run
                log(f"cleanup: {step.__name__}: {type(exc).__name__}: {exc}")
        return await self.run.cleanup()


def ack(reply: Frame, what: str) -> Frame:
    if reply.get("op") != "ack":
        raise RuntimeError(f"{what}: expected an ack, got {reply}")
    return reply


async def count_groups(http: HttpUsers, user: str) -> int:
    n, cursor = 0, None
    for _ in range(1000):
        page = await http[user].ok("GET", "/v1/groups",
                                   params={"limit": 200, **({"cursor": cursor} if cursor else {})})
        n += len(page["groups"])
        if not (cursor := page.get("cursor")):
            break
    return n


def lag_summary(lag: list[float]) -> dict[str, Any]:
    s = sorted(lag)
    return {k: round((percentile(s, p) or 0.0) * 1000, 1) for k, p in
            (("p50", 50), ("p99", 99), ("max", 100))}


# -- the report ----------------------------------------------------------------------------
def summarise(res: dict[str, Any]) -> dict[str, Any]:
    """Per call: each phase's figures and its p50 over the baseline's; the attacker's
    refusals; setup time; node CPU per phase."""
    phases = {p: res[p] for p in PHASES if isinstance(res.get(p), dict) and "calls" in res[p]}
    calls: dict[str, Any] = {}
    for c in CALLS:
        row: dict[str, Any] = {p: phases[p]["calls"][c] for p in phases}
        base = (phases.get("baseline") or {}).get("calls", {}).get(c, {}).get("p50_ms")
        ratios = {p: round(phases[p]["calls"][c]["p50_ms"] / base, 2)
                  for p in phases if p != "baseline" and base
                  and phases[p]["calls"][c]["p50_ms"] is not None}
        row["p50_ratio"] = ratios
        row["limit"] = LIMITS[c]
        row["within"] = {p: r <= LIMITS[c] for p, r in ratios.items()}
        calls[c] = row
    node_pid = str(res.get("node_pid"))
    out: dict[str, Any] = {"calls": calls, "node_cores": {
        p: phases[p]["cpu"]["by_pid"].get(node_pid) for p in phases},
        "machine_busy_pct": {p: phases[p]["cpu"]["machine_busy_pct"] for p in phases},
        "loop_lag_ms": {p: phases[p]["loop_lag_ms"] for p in phases},
        "cpu_top": {p: [f"{t['what']}: {t['cores']}" for t in phases[p]["cpu"]["top"][:5]]
                    for p in phases}}
    if (setup := res.get("setup")) and "error" not in setup:
        out["setup"] = {k: setup[k] for k in ("groups_s", "attacker_s", "total_s",
                                              "victim_groups", "cap_probes")}
        out["setup"]["attacker_state"] = setup["attacker_state"]
        out["setup"]["one_more_conn"] = setup["attacker"]["one_more_conn"]
    if att := (phases.get("attack") or {}).get("attacker"):
        out["attacker"] = {k: att[k] for k in ("answers", "typing", "http",
                                               "group_send_per_s", "group_acks_per_s",
                                               "group_send_ack", "error_pushes",
                                               "closed_by_node", "reopen_attempts")}
    if attack := phases.get("attack"):
        out["attack_store_top"] = attack.get("store_commands", [])[:3]
    if (probe := res.get("store_probe")) and "error" not in probe:
        out["store_probe"] = probe
    errors = {k: v["error"] for k, v in res.items() if isinstance(v, dict) and "error" in v}
    if errors:
        out["errors"] = errors
    return out


def table(summary: dict[str, Any]) -> str:
    def fig(s: dict[str, Any] | None) -> str:
        if not s or s.get("p50_ms") is None:
            return "-"
        err = f" err {sum(s['errors'].values())}" if s.get("errors") else ""
        return f"{s['p50_ms']}/{s['p99_ms']}/{s['max_ms']} n{s['n']}{err}"

    lines = [f"{'call':<14}" + "".join(f"{p + ' p50/p99/max ms':<34}" for p in PHASES)
             + "p50 ratio (limit)"]
    for c, row in summary["calls"].items():
        ratios = ", ".join(f"{p} {r}x" for p, r in row["p50_ratio"].items())
        lines.append(f"{c:<14}" + "".join(f"{fig(row.get(p)):<34}" for p in PHASES)
                     + f"{ratios} ({row['limit']}x)")
    lines.append(f"node cores: {summary['node_cores']}; machine busy %: "
                 f"{summary['machine_busy_pct']}; loop lag ms: {summary['loop_lag_ms']}")
    if s := summary.get("setup"):
        lines.append(f"setup: groups {s['groups_s']} s, attacker {s['attacker_s']} s "
                     f"(total {s['total_s']} s); victim in {s['victim_groups']} groups; "
                     f"probes {s['cap_probes']}; one more conn: {s['one_more_conn']}")
        lines.append(f"attacker state: {s['attacker_state']}")
    if att := summary.get("attacker"):
        lines.append(f"attacker answers: {att['answers']}; http {att['http']}; error pushes "
                     f"{att['error_pushes']}; closed {att['closed_by_node']}; group sends "
                     f"{att['group_send_per_s']}/s, acked {att['group_acks_per_s']}/s, "
                     f"ack p50 {att['group_send_ack']['p50_ms']} ms")
    lines.append(f"busiest processes: {summary['cpu_top']}")
    if top := summary.get("attack_store_top"):
        lines.append("store time under attack: " + "; ".join(
            f"{c['command']} x{c['count']}: {c['seconds']} s" for c in top))
    if probe := summary.get("store_probe"):
        lines.append(f"the store alone, same run ({probe['docs']} documents): findAndModify by "
                     f"_id {probe['find_and_modify_ms']} ms, update {probe['update_one_ms']} ms,"
                     f" find {probe['find_one_ms']} ms")
    if errors := summary.get("errors"):
        lines.append(f"ERRORS: {errors}")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.new_parser("bench.abuse", __doc__, (
        ("--seconds", float, 20.0, "measured seconds per phase"),
        ("--groups", int, int(Settings.max_groups_joined),
         "groups with the victim in them, its own included (IM_MAX_GROUPS_JOINED)"),
        ("--members", int, 102, "members of each attacker group (over "
         "IM_GROUP_WRITE_DIFFUSION_MAX: read-diffused)"),
        ("--watches", int, int(Settings.max_conns_per_user * Settings.presence_subs_max),
         "distinct ids the main attacker presence-subscribes, over its connections"),
        ("--new-convs", int, int(Settings.max_new_convs_per_day),
         "new 1:1 conversations the main attacker starts (IM_MAX_NEW_CONVS_PER_DAY)"),
        ("--past-cap", int, 5, "new conversations tried past --new-convs"),
        ("--attacker-conns", int, int(Settings.max_conns_per_user),
         "the main attacker's WebSockets (IM_MAX_CONNS_PER_USER)"),
        ("--attack-scale", float, 1.0, "the attacker's rates as a fraction of its budgets"),
        ("--send-rate", float, 20.0, "B1's 1:1 sends per second (each waits for its ack)"),
        ("--call-rate", float, 4.0, "V's calls per second, of each kind"),
        ("--setup-concurrency", int, 8, "group creations in flight during the setup"),
        ("--creates-per-min", int, 1_000_000,
         "the node's IM_GROUP_CREATES_PER_MIN for this run (the one cap raised)")))
    p.add_argument("--quick", action="store_true",
                   help="a small run: 200 groups, 10 s phases, 2,000 watches")
    args = cli.parse(p, argv)
    if args.quick:
        args.groups, args.seconds, args.watches = 200, 10.0, 2000
    if min(args.groups, args.members, args.attacker_conns, args.setup_concurrency) < 1 or \
            min(args.seconds, args.send_rate, args.call_rate, args.attack_scale) <= 0 or \
            min(args.watches, args.new_convs, args.past_cap) < 0 or args.members < 3:
        p.error("--groups/--attacker-conns/--setup-concurrency >= 1, --members >= 3, "
                "rates and --seconds > 0, --watches/--new-convs/--past-cap >= 0")
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    b = Bench(args)
    res: dict[str, Any] = {"namespace": b.ns, "nodes": b.run.nodes,
                           "node_settings": b.node_settings(),
                           "note": "real per-connection and per-user budgets; every cap at its "
                           "default but IM_GROUP_CREATES_PER_MIN, raised for the setup; "
                           "per-address limits off (all traffic from 127.0.0.1)"}
    try:
        await b.start()
        assert b.node is not None
        res["node_pid"] = b.node.pid
        res["content"] = await b.content()
        await b.warmup()
        for name in PHASES:
            if name == "caps_filled":
                res["setup"] = await common.reported(b.setup_attack(), 3600)
                if "error" in res["setup"]:
                    break
                log(f"setup: {res['setup']['total_s']} s")
            res[name] = await common.reported(b.phase(name, name == "attack"),
                                              args.seconds + 300)
            if "error" in res[name]:
                log(f"{name}: {res[name]['error']}")
                break
        # The store's own speed at the seq allocation, at the size of the
        # groups collection the attack ran against (bench/store_probe.py).
        res["store_probe"] = await common.reported(
            store_probe.probe(args.mongo_url, args.groups), 300)
    finally:
        res["cleanup"] = await b.close()
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--attacker-child"]:
        common.run_loop(attacker_child())
        return 0
    args = parse_args(argv)
    args.argv, args.stamp = argv, common.utc_stamp()
    args.code = common.code_version(getattr(args, "node_tree", None))
    res: dict[str, Any] = {"command": cli.command_line("bench.abuse", argv), "utc": args.stamp,
                           "machine": common.machine_facts(), "code": args.code,
                           "settings": {k: v for k, v in vars(args).items()
                                        if k not in ("argv", "stamp", "code")}}
    common.OUT_DIR.mkdir(parents=True, exist_ok=True)
    try:
        res.update(common.run_loop(run(args)))
    except KeyboardInterrupt:
        return 130
    res["summary"] = summary = summarise(res)
    res["json"] = str(common.write_json(res, args.stamp, "abuse"))
    print(table(summary) + f"\nresults: {res['json']}", file=sys.stderr)
    sys.stdout.buffer.write(orjson.dumps({"json": res["json"], **summary},
                                         option=orjson.OPT_INDENT_2) + b"\n")
    broke = "errors" in summary or any(p not in res for p in PHASES)
    return 1 if broke else 0


if __name__ == "__main__":
    raise SystemExit(main())
