"""The deployment as Docker Compose resolves it: ``docker compose config`` of
each variant (file set and profiles), parsed. No Docker engine is needed.

The command is ``$IMGATE_COMPOSE`` if set (e.g. ``docker compose``), else
``docker compose`` when the Docker CLI has a v2 plugin, else the pinned
binary that scripts/compose_cli.sh (run by scripts/setup.sh) puts in
``.venv/bin/docker-compose``. It runs with a clean environment and a
generated env file, so a developer's ``.env`` or ``COMPOSE_*`` variables
cannot change what is checked.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BASE = "docker-compose.yml"
CLUSTER = "docker-compose.cluster.yml"

# name -> (compose files, profiles): every profile of every file set.
VARIANTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((BASE,), ()),
    "monitoring": ((BASE,), ("monitoring",)),
    "cluster": ((BASE, CLUSTER), ()),
    "cluster+monitoring": ((BASE, CLUSTER), ("monitoring",)),
    "cluster+single+monitoring": ((BASE, CLUSTER), ("single", "monitoring")),
}


@cache
def compose_command() -> tuple[str, ...]:
    if os.environ.get("IMGATE_COMPOSE"):
        return tuple(shlex.split(os.environ["IMGATE_COMPOSE"]))
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version", "--short"],
                               capture_output=True, text=True, timeout=60)
        if probe.returncode == 0 and probe.stdout.strip().lstrip("v").startswith("2."):
            return ("docker", "compose")
    local = REPO / ".venv" / "bin" / "docker-compose"
    if local.exists():
        return (str(local),)
    pytest.fail("no Docker Compose v2 here: run `bash scripts/compose_cli.sh` "
                "(scripts/setup.sh does)")


def run_compose(files: tuple[str, ...], profiles: tuple[str, ...], env_file: Path,
                *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [*compose_command(), "--project-directory", str(REPO), "--env-file", str(env_file)]
    for f in files:
        cmd += ["-f", str(REPO / f)]
    for p in profiles:
        cmd += ["--profile", p]
    env = {k: os.environ[k] for k in ("PATH", "HOME", "DOCKER_CONFIG") if k in os.environ}
    return subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=120)


@pytest.fixture(scope="session")
def env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway env file in place of the (uncommitted) .env: the defaults only."""
    path = tmp_path_factory.mktemp("compose") / "env"
    path.write_text("# tests/deploy: no overrides, the compose files' own defaults\n")
    return path


@pytest.fixture(scope="session")
def configs(env_file: Path) -> dict[str, dict[str, Any]]:
    """``docker compose config --format json`` of every variant."""
    out = {}
    for name, (files, profiles) in VARIANTS.items():
        done = run_compose(files, profiles, env_file, "config", "--format", "json")
        assert done.returncode == 0, f"{name}: docker compose config failed:\n{done.stderr}"
        out[name] = json.loads(done.stdout)
    return out


@pytest.fixture(params=list(VARIANTS))
def variant(request: pytest.FixtureRequest, configs: dict[str, dict[str, Any]]
            ) -> tuple[str, dict[str, Any]]:
    return request.param, configs[request.param]
