"""What operators are handed (deploy/): the Grafana dashboard and the Prometheus
rules name only metrics a real node exports, on its own metrics listener."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import yaml  # PyYAML: in the test extra through schemathesis
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import Settings
from testkit.probe import sample
from tests.conftest import uid

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "imgate.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"

# Series Prometheus makes itself, not the node.
PROMETHEUS_OWN = {"up"}
# Labels Prometheus adds at scrape time, and a histogram's bucket bound.
SCRAPE_LABELS = {"job", "instance", "le"}
SEVERITIES = {"critical", "warning", "info"}

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
             "group_left", "group_right", "inf", "nan"}


# -- reading PromQL (enough of it for names and matchers) ----------------------------
def _bare(expr: str) -> str:
    """``expr`` without Grafana variables and string literals."""
    expr = re.sub(r"\$\{?\w+\}?", "", expr)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (not functions, keywords, labels)."""
    s = _bare(expr)
    s = re.sub(r"\{[^}]*\}", "", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", "", s)  # ranges, subqueries
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", s)
    s = re.sub(r"\boffset\s+\w+", "", s)
    names = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", s):
        if s[m.end():].lstrip().startswith("("):
            continue  # a function or an aggregation
        if m.group() not in _KEYWORDS:
            names.add(m.group())
    return names


def matchers(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, label names matched) of each ``metric{...}`` selector."""
    out = []
    for m in re.finditer(r"([A-Za-z_:][\w:]*)\s*\{([^}]*)\}", _bare(expr)):
        out.append((m.group(1), set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", m.group(2)))))
    return out


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = []
    for panel in board["panels"]:
        for nested in [panel, *panel.get("panels", [])]:
            exprs += [t["expr"] for t in nested.get("targets", [])]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1",
                                var["definition"]))
    return exprs


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


# -- reading the exposition --------------------------------------------------------------
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                              "_created"),
             "summary": ("", "_sum", "_count", "_created"), "info": ("_info",)}


def exported(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """Every series name the scrape can hold (a labelled family with no child
    yet still counts) and, per series name, the label names seen on it."""
    names: set[str] = set()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        names |= {family.name + s for s in _SUFFIXES.get(family.type, ("",))}
        for s in family.samples:
            names.add(s.name)
            labels.setdefault(s.name, set()).update(s.labels)
    return names, labels


# -- the test ---------------------------------------------------------------------------
async def test_dashboard_and_alerts_name_only_exported_metrics(make_node, connect, http):
    node = await make_node()
    a, b = uid("a"), uid("b")
    ca, cb = await connect(node, a), await connect(node, b)
    assert (await ca.request("send", to=b, cmid="c1", body="hi"))["op"] == "ack"
    await cb.next_push("msg")
    room = uid("room")
    assert (await ca.request("join", room=room))["op"] == "joined"
    assert (await ca.request("room_send", room=room, body="hello"))["op"] == "ok"
    assert (await ca.request("frobnicate"))["op"] == "error"
    assert (await http(a, node).get("/v1/sync")).status_code == 200
    assert (await http(a, node).get("/v1/no/such/route")).status_code == 404
    async with httpx.AsyncClient() as c:  # as Prometheus scrapes it
        assert (await c.get(f"http://127.0.0.1:{node.http_port}/v1/sync")).status_code == 401
        r = await c.get(f"http://127.0.0.1:{node.metrics_port}/metrics")
    assert r.status_code == 200
    text = r.text
    names, labels = exported(text)

    # (a) the dashboard's and the rules' expressions name exported series only
    alert_rules = rules()
    recorded = {r["record"] for r in alert_rules if "record" in r}
    referenced: dict[str, set[str]] = {}
    for where, exprs in (("dashboard", dashboard_exprs()),
                         ("alerts.yml", [r["expr"] for r in alert_rules])):
        for expr in exprs:
            for name in metric_names(expr):
                referenced.setdefault(name, set()).add(where)
            for name, keys in matchers(expr):
                seen = labels.get(name)
                if seen is not None:  # a family with children: its labels are known
                    assert keys <= seen | SCRAPE_LABELS, (where, expr, keys - seen)
    assert {"im_connections", "im_send_ack_seconds_bucket", "im_room_msgs_dropped_total",
            "im_http_requests_total", "process_resident_memory_bytes", "up"} <= set(referenced)
    unknown = {n: w for n, w in referenced.items()
               if n not in names and n not in PROMETHEUS_OWN and n not in recorded}
    assert not unknown, f"named in deploy/ but not exported by the node: {unknown}"

    # (b) the HTTP calls, by route template and status
    assert sample(text, 'im_http_requests_total{route="/v1/sync",status="200"}') == 1
    assert sample(text, 'im_http_requests_total{route="/v1/sync",status="401"}') == 1
    assert sample(text, 'im_http_requests_total{route="unmatched",status="404"}') == 1

    # (c) the process collector is on the node's own registry
    assert sample(text, "process_resident_memory_bytes") > 10 * 2**20
    assert sample(text, "process_open_fds") >= 3  # at least the three listeners
    assert sample(text, "process_max_fds") >= sample(text, "process_open_fds")
    assert sample(text, "process_cpu_seconds_total") > 0
    assert "python_gc_collections_total" in names


def test_rules_and_dashboard_are_complete() -> None:
    for rule in rules():
        assert rule["expr"].strip()
        if "record" in rule:
            assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule["record"])
            continue
        assert re.fullmatch(r"Imgate[A-Za-z0-9]+", rule["alert"]), rule
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
    alerts = [r["alert"] for r in rules() if "alert" in r]
    assert len(alerts) == len(set(alerts))

    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert "instance" in variables and "job" in variables
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for p in panels:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            if "up" not in metric_names(t["expr"]):
                assert 'instance=~"$instance"' in t["expr"], (p["title"], t["expr"])

    config = yaml.safe_load(PROMETHEUS.read_text())
    assert config["rule_files"] == ["alerts.yml"]
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "imgate")
    port = Settings.from_env({}).metrics_port
    assert all(t.endswith(f":{port}") for t in job["static_configs"][0]["targets"])


def test_reading_promql() -> None:
    expr = ('histogram_quantile(0.99, sum by (job, le) (rate(im_send_ack_seconds_bucket'
            '{job=~"$job", stage="a b"}[$__rate_interval] offset 1h))) > 0.25 and on '
            '(job, instance) im_connections < 1.2 * (im_connections offset 1h) + 1e3')
    assert metric_names(expr) == {"im_send_ack_seconds_bucket", "im_connections"}
    assert matchers(expr) == [("im_send_ack_seconds_bucket", {"job", "stage"})]
