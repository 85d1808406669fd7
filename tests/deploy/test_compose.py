"""What an operator relies on in docker-compose.yml (+ docker-compose.cluster.yml),
checked on ``docker compose config`` of every variant (tests/deploy/conftest.py):
only the edge publishes ports, no guest credentials, credentials only from
secrets, a stop grace period longer than the drain, gateways that scale
(no pinned node ids), MongoDB started as a replica set, Redis with a password,
metrics and RabbitMQ's management inside the network."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from gateway.config import Settings
from tests.deploy.conftest import REPO

Variant = tuple[str, dict[str, Any]]

EDGE = "edge"
GATEWAY = "gateway"
# Published on the host's loopback only (an SSH tunnel's end), monitoring profile.
LOOPBACK_ONLY = {"grafana"}
# After the drain the node closes listeners and stores (each step bounded too):
# the grace period must leave at least this on top of IM_DRAIN_TIMEOUT_S.
CLOSE_MARGIN_S = 20.0
DOCKER_DEFAULT_GRACE = "10s"
SECRET_REF = re.compile(r"\{secret:([A-Za-z0-9][A-Za-z0-9_.-]*)\}")
SECRETISH = re.compile(r"SECRET|PASSWORD|PASS$|_KEYS?$|COOKIE|TOKEN")
GUEST = re.compile(r"guest:guest|//guest[:@]|\bdefault_(?:user|pass)\s*=\s*guest\b", re.I)


# -- reading the config --------------------------------------------------------------
def services(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return cfg["services"]


def env_of(svc: dict[str, Any]) -> dict[str, str]:
    return {k: "" if v is None else str(v) for k, v in (svc.get("environment") or {}).items()}


def gateways(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Services running the gateway: built from this repository."""
    found = {n: s for n, s in services(cfg).items() if "build" in s}
    assert set(found) == {GATEWAY}, found.keys()
    return found


def by_image(cfg: dict[str, Any], prefix: str) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services(cfg).items() if s.get("image", "").startswith(prefix)}


def text_of(svc: dict[str, Any]) -> str:
    """A service's command line, entrypoint and healthcheck as one string."""
    parts: list[str] = []
    for key in ("entrypoint", "command"):
        value = svc.get(key) or []
        parts += [value] if isinstance(value, str) else value
    parts += (svc.get("healthcheck") or {}).get("test") or []
    return "\n".join(parts)


def strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in [str(k), *strings(v)]]
    if isinstance(node, list):
        return [s for v in node for s in strings(v)]
    return [str(node)] if node is not None else []


def duration_s(text: str) -> float:
    """A Go duration as compose prints it ("1m0s", "45s", "1h2m3.5s", "500ms")."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def version(tag: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", tag.split("-")[0]))


# -- ports -----------------------------------------------------------------------------
def test_only_the_edge_publishes_ports(variant: Variant) -> None:
    name, cfg = variant
    published = {n: s["ports"] for n, s in services(cfg).items() if s.get("ports")}
    edge = {(p.get("host_ip"), int(p["published"]), p["target"]) for p in published.pop(EDGE)}
    assert edge == {(None, 443, 443), (None, 80, 80)}, (name, edge)
    for svc, ports in published.items():
        assert svc in LOOPBACK_ONLY, f"{name}: {svc} publishes {ports}"
        assert all(p.get("host_ip") == "127.0.0.1" for p in ports), (name, svc, ports)
    for svc, s in services(cfg).items():
        # a published port also needs no `ports`: host networking would bypass all this
        assert s.get("network_mode") is None, (name, svc)


def test_metrics_and_management_are_not_published(variant: Variant) -> None:
    name, cfg = variant
    (gw,) = gateways(cfg).values()
    metrics_port = int(env_of(gw).get("IM_METRICS_PORT") or Settings().metrics_port)
    targets = {p["target"] for s in services(cfg).values() for p in s.get("ports") or []}
    assert not targets & {metrics_port, 15672, 5672, 6379, 27017, 9090}, (name, targets)
    assert env_of(gw).get("IM_METRICS_PUBLIC", "0") == "0"  # not on the API port either


# -- credentials -------------------------------------------------------------------------
def test_no_guest_credentials(variant: Variant) -> None:
    name, cfg = variant
    found = [s for s in strings(cfg) if GUEST.search(s)]
    for svc in services(cfg).values():
        for env_name, value in env_of(svc).items():
            if env_name.startswith("RABBITMQ_DEFAULT_") and value.lower() == "guest":
                found.append(f"{env_name}={value}")
        for mount in svc.get("volumes") or []:
            source = Path(mount.get("source", ""))
            if mount.get("type") == "bind" and source.is_file():
                found += [f"{source}: {m.group()}" for m in GUEST.finditer(source.read_text())]
    assert not found, f"{name}: guest credentials: {found}"
    # RabbitMQ creates its own user instead, and guest may only log in from localhost.
    for svc_name, svc in by_image(cfg, "rabbitmq:").items():
        script = text_of(svc)
        user = re.search(r"default_user = (\S+)", script)
        assert user and user.group(1) != "guest", (name, svc_name)
        assert "default_pass = $(cat /run/secrets/" in script.replace("$$", "$"), svc_name
        assert "loopback_users.guest = true" in script, svc_name


def test_credentials_come_from_secrets(variant: Variant) -> None:
    name, cfg = variant
    secret_files = {k: Path(v["file"]) for k, v in cfg.get("secrets", {}).items()}
    for secret, path in secret_files.items():
        assert path.parent == REPO / "deploy" / "secrets", (secret, path)
    assert "deploy/secrets/" in (REPO / ".gitignore").read_text().split()
    for svc_name, svc in services(cfg).items():
        mounted = {s["source"] for s in svc.get("secrets") or []}
        assert mounted <= set(secret_files), (name, svc_name)
        for key, value in env_of(svc).items():
            refs = set(SECRET_REF.findall(value))
            assert refs <= mounted, f"{name}: {svc_name}.{key} names unmounted {refs - mounted}"
            if SECRETISH.search(key) and not key.endswith("_FILE"):
                assert SECRET_REF.fullmatch(value), f"{name}: {svc_name}.{key} is a literal"
            if "://" in value:
                for url in value.split(","):
                    password = urlsplit(url.strip()).password
                    assert password is None or SECRET_REF.fullmatch(password), (svc_name, key)
            if key.endswith("_FILE"):
                assert value.startswith("/run/secrets/"), (svc_name, key)
                assert value.removeprefix("/run/secrets/") in mounted, (svc_name, key)


def test_redis_requires_a_password(variant: Variant) -> None:
    name, cfg = variant
    redis = {n: s for n, s in by_image(cfg, "redis:").items() if "redis-server" in text_of(s)}
    assert redis, name
    for svc_name, svc in redis.items():
        script = text_of(svc).replace("$$", "$")
        entrypoint = svc["entrypoint"][2]  # sh -c SCRIPT: writes the file the command loads
        assert "requirepass" in entrypoint and "$(cat /run/secrets/redis_password)" in script
        assert "> /tmp/auth.conf" in entrypoint and "/tmp/auth.conf" in svc["command"], svc_name
        assert {s["source"] for s in svc["secrets"]} == {"redis_password"}, svc_name
        assert 'REDISCLI_AUTH="$(cat /run/secrets/redis_password)"' in script, svc_name
        if "--cluster-enabled" in svc["command"]:
            assert "masterauth" in script, svc_name  # replicas authenticate to masters
    (gw,) = gateways(cfg).values()
    for url in env_of(gw)["IM_REDIS_URL"].split(","):
        assert urlsplit(url.strip()).password == "{secret:redis_password}", (name, url)


# -- the gateways ---------------------------------------------------------------------------
def test_stop_grace_period_outlasts_the_drain(variant: Variant) -> None:
    name, cfg = variant
    for svc_name, svc in gateways(cfg).items():
        drain = float(env_of(svc).get("IM_DRAIN_TIMEOUT_S") or Settings().drain_timeout_s)
        grace = duration_s(svc.get("stop_grace_period") or DOCKER_DEFAULT_GRACE)
        assert grace >= drain + CLOSE_MARGIN_S, f"{name}: {svc_name}: {grace}s vs drain {drain}s"
        assert svc.get("stop_signal") in (None, "SIGTERM"), svc_name  # SIGTERM drains


def test_gateways_scale(variant: Variant) -> None:
    name, cfg = variant
    for svc_name, svc in gateways(cfg).items():
        env = env_of(svc)
        assert "IM_NODE_ID" not in env, f"{name}: {svc_name} pins a node id"
        assert "container_name" not in svc, svc_name  # `--scale` needs generated names
        assert "hostname" not in svc, svc_name
        assert not svc.get("ports"), svc_name
        assert env["IM_ENV"] == "production"  # no start without IM_AUTH_SECRET
        assert env["IM_AUTH_SECRET"] == "{secret:im_auth_secret}"
        assert svc["deploy"]["replicas"] >= 2
    edge = services(cfg)[EDGE]
    assert edge["depends_on"][GATEWAY]["condition"] == "service_healthy"


def test_mongo_runs_as_a_replica_set(variant: Variant) -> None:
    name, cfg = variant
    [(mongo_name, mongo)] = by_image(cfg, "mongo:").items()
    command = mongo["command"]
    replset = command[command.index("--replSet") + 1]
    assert "--keyFile" in command and "--bind_ip_all" in command
    check = " ".join(mongo["healthcheck"]["test"])
    assert f'rs.initiate({{_id: "{replset}"' in check, check  # the first check initiates it
    assert f'host: "{mongo_name}:27017"' in check
    assert "isWritablePrimary" in check  # healthy = primary: the gateways wait for one
    env = env_of(mongo)
    assert "MONGO_INITDB_ROOT_PASSWORD" not in env
    assert env["MONGO_INITDB_ROOT_PASSWORD_FILE"] == "/run/secrets/mongo_root_password"
    init = [m for m in mongo["volumes"] if m["target"].startswith("/docker-entrypoint-initdb.d/")]
    assert [Path(m["source"]).name for m in init] == ["init-app-user.sh"]
    (gw,) = gateways(cfg).values()
    url = urlsplit(env_of(gw)["IM_MONGO_URL"])
    assert parse_qs(url.query)["replicaSet"] == [replset], name
    assert url.username != "root" and url.password == "{secret:mongo_app_password}"
    assert gw["depends_on"][mongo_name]["condition"] == "service_healthy"


def test_data_stores_stay_inside(variant: Variant) -> None:
    name, cfg = variant
    internal = {n for n, net in cfg["networks"].items() if net.get("internal")}
    for svc_name, svc in services(cfg).items():
        image = svc.get("image", "")
        if image.startswith(("mongo:", "redis:", "rabbitmq:", "prom/prometheus:")):
            assert set(svc["networks"]) <= internal, (name, svc_name, svc["networks"])


def test_images_are_pinned(variant: Variant) -> None:
    name, cfg = variant
    for svc_name, svc in services(cfg).items():
        if "build" in svc:
            continue
        image = svc["image"]
        tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else ""
        assert re.match(r"v?\d+\.\d+", tag), f"{name}: {svc_name} runs {image!r}"
        assert svc.get("restart") in ("unless-stopped", "always", None), svc_name
    nginx = services(cfg)[EDGE]["image"]
    assert nginx.startswith("nginx:") and version(nginx.partition(":")[2]) >= (1, 27, 3), nginx
    mounts = {m["target"]: Path(m["source"]) for m in services(cfg)[EDGE]["volumes"]}
    assert mounts["/etc/nginx/nginx.conf"] == REPO / "deploy" / "nginx.conf"
    assert mounts["/etc/nginx/tls"] == REPO / "deploy" / "tls"


# -- the variants ---------------------------------------------------------------------------
def test_profiles_and_the_cluster_override(configs: dict[str, dict[str, Any]]) -> None:
    assert {"prometheus", "grafana"}.isdisjoint(services(configs["default"]))
    assert {"prometheus", "grafana"} <= set(services(configs["monitoring"]))
    single = services(configs["default"])
    assert {"mongo", "redis", "rabbitmq", GATEWAY, EDGE} == set(single)

    clustered = services(configs["cluster"])
    assert {"redis", "rabbitmq"}.isdisjoint(clustered)  # the single servers do not start
    assert {"redis", "rabbitmq"} <= set(services(configs["cluster+single+monitoring"]))
    gw = clustered[GATEWAY]
    env = env_of(gw)
    assert env["IM_REDIS_CLUSTER"] == "1"
    assert [urlsplit(u).hostname for u in env["IM_AMQP_URL"].split(",")] == ["rmq1", "rmq2",
                                                                             "rmq3"]
    assert set(gw["depends_on"]) == {"mongo", "redis-cluster-init", "rmq1", "rmq2", "rmq3"}
    assert gw["depends_on"]["redis-cluster-init"]["condition"] == "service_completed_successfully"
    init = text_of(clustered["redis-cluster-init"]).replace("$$", "$")
    assert 'REDISCLI_AUTH="$(cat /run/secrets/redis_password)"' in init
    for n in ("rmq1", "rmq2", "rmq3"):
        assert "/run/secrets/rabbitmq_erlang_cookie" in text_of(clustered[n])
        assert "RABBITMQ_ERLANG_COOKIE" not in env_of(clustered[n])  # an env value, deprecated


def test_prometheus_finds_every_replica(configs: dict[str, dict[str, Any]]) -> None:
    cfg = configs["monitoring"]
    prom = services(cfg)["prometheus"]
    mounts = {m["target"]: Path(m["source"]) for m in prom["volumes"]}
    config = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    assert mounts["/etc/prometheus/alerts.yml"] == REPO / "deploy" / "prometheus" / "alerts.yml"
    assert config["rule_files"] == ["alerts.yml"]
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "imgate")
    env = env_of(gateways(cfg)[GATEWAY])
    workers = int(env["IM_WORKERS"])
    assert workers >= 2  # a replica uses its cores
    sds = job["dns_sd_configs"]
    assert all(sd["names"] == [GATEWAY] and sd["type"] == "A" for sd in sds)
    # One target per worker: IM_METRICS_PORT + its index.
    first = int(env["IM_METRICS_PORT"])
    assert sorted(sd["port"] for sd in sds) == list(range(first, first + workers))
    assert env["IM_METRICS_HOST"] == "0.0.0.0"  # reachable from Prometheus' container
    assert set(prom["networks"]) & set(gateways(cfg)[GATEWAY]["networks"])
    grafana = services(cfg)["grafana"]
    assert env_of(grafana)["GF_SECURITY_ADMIN_PASSWORD__FILE"].startswith("/run/secrets/")
    grafana_mounts = {m["target"]: Path(m["source"]) for m in grafana["volumes"]}
    assert (grafana_mounts["/var/lib/grafana/dashboards/imgate"] / "imgate.json").is_file()
