"""The gateway image: the Dockerfile installs the locked dependencies in a layer
of their own before the code, .dockerignore keeps secrets and the rest out of
the build context, and the entrypoint fills ``{secret:NAME}`` settings from
Docker secrets before it becomes ``python -m gateway``."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import jwt
import pytest

from tests.deploy.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"
ENTRYPOINT = REPO / "deploy" / "gateway-entrypoint.py"
NEVER_IN_CONTEXT = [".env", "deploy/secrets/im_auth_secret", "deploy/secrets/redis_password",
                    "deploy/tls/privkey.pem", ".venv/bin/python", ".git/config",
                    "tests/conftest.py", "bench/out/x.json", "secantus-data/x",
                    "gateway/__pycache__/node.cpython-311.pyc", "imgate.egg-info/PKG-INFO",
                    "gateway/_fanout.cpython-311-x86_64-linux-gnu.so"]  # built here, not there


# -- Dockerfile ----------------------------------------------------------------------------
def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def copy_sources() -> list[str]:
    sources = []
    for op, rest in instructions():
        if op == "COPY":
            args = [a for a in rest.split() if not a.startswith("--")]
            sources += args[:-1]
    return sources


def test_locked_dependencies_are_a_layer_before_the_code() -> None:
    steps = instructions()
    copies = [(i, rest.split()[:-1]) for i, (op, rest) in enumerate(steps) if op == "COPY"]
    lock_step = next(i for i, srcs in copies if srcs == ["requirements.lock"])
    install = next(i for i, (op, rest) in enumerate(steps)
                   if op == "RUN" and "-r requirements.lock" in rest)
    assert "--require-hashes" in steps[install][1]
    code_steps = [i for i, srcs in copies if {"core", "gateway", "router", "store"} & set(srcs)]
    assert len(code_steps) == 4 and lock_step < install < min(code_steps)
    assert not [i for i, srcs in copies if "." in srcs]  # no `COPY . .`: the lock layer holds
    (project,) = [rest for op, rest in steps if op == "RUN" and "pip install" in rest
                  and "requirements.lock" not in rest]
    assert "--no-deps" in project and "--no-build-isolation" in project
    assert steps[0] == ("FROM", "python:3.11-slim")  # the Python the lock is made for
    users = [rest for op, rest in steps if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    entry = next(rest for op, rest in steps if op == "ENTRYPOINT")
    assert "/usr/local/bin/imgate-entrypoint" in entry


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or a parent of it wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.removeprefix("!").strip("/")
        regex = re.escape(pat).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        regex = re.sub(r"\\\[(.*?)\\\]", lambda m: "[" + m.group(1) + "]", regex)
        if any(re.fullmatch(regex, p) for p in prefixes):
            result = not negate
    return result


def test_dockerignore_lets_in_only_what_is_copied() -> None:
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for path in NEVER_IN_CONTEXT:
        assert ignored(path, patterns), f"{path} would be sent to the Docker build"
    for src in copy_sources():
        assert (REPO / src).exists(), src
        assert not ignored(src, patterns), f"COPY {src}: excluded by .dockerignore"
        if (REPO / src).is_dir():
            for f in (REPO / src).rglob("*.py"):
                if "__pycache__" not in f.parts:
                    assert not ignored(str(f.relative_to(REPO)), patterns), f
    assert ignored("gateway/__pycache__/app.cpython-311.pyc", patterns)
    assert not ignored("store/lua/counter.lua", patterns)  # package data goes in


# -- the entrypoint ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def entry() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gateway_entrypoint", ENTRYPOINT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def secrets(tmp_path: Path) -> Path:
    (tmp_path / "redis_password").write_text("p@ss/w:rd%\n")
    (tmp_path / "im_auth_secret").write_text("s" * 40 + "\r\n")
    (tmp_path / "im_api_keys").write_text("k" * 24 + ",K" + "k" * 23)
    (tmp_path / "empty").write_text("\n")
    return tmp_path


def test_entrypoint_fills_secrets(entry: ModuleType, secrets: Path) -> None:
    env = {"IM_REDIS_URL": "redis://:{secret:redis_password}@redis:6379/0",
           "IM_AUTH_SECRET": "{secret:im_auth_secret}",
           "IM_API_KEYS": "{secret:im_api_keys}",
           "IM_HOST": "0.0.0.0",
           "OTHER": "{secret:redis_password}"}
    filled = entry.fill_secrets(env, secrets)
    assert filled == {
        "IM_REDIS_URL": "redis://:p%40ss%2Fw%3Ard%25@redis:6379/0",  # encoded in a URL
        "IM_AUTH_SECRET": "s" * 40,  # verbatim elsewhere, the newline dropped
        "IM_API_KEYS": "k" * 24 + ",K" + "k" * 23,
    }
    from redis.asyncio.connection import parse_url
    assert parse_url(filled["IM_REDIS_URL"])["password"] == "p@ss/w:rd%"


@pytest.mark.parametrize(("value", "message"), [
    ("{secret:missing}", "cannot read secret 'missing'"),
    ("{secret:empty}", "secret 'empty'"),
    ("{secret:bad name}", "not {secret:NAME}"),
    ("{secret:../redis_password}", "not {secret:NAME}"),
])
def test_entrypoint_refuses_what_it_cannot_fill(entry: ModuleType, secrets: Path,
                                                value: str, message: str) -> None:
    with pytest.raises(entry.SecretError, match=re.escape(message)) as err:
        entry.fill_secrets({"IM_AUTH_SECRET": value}, secrets)
    assert str(err.value).startswith("IM_AUTH_SECRET: ")


def test_entrypoint_becomes_the_gateway(secrets: Path) -> None:
    """The real script: its secret-filled environment reaches `python -m gateway token`."""
    env = {"PATH": os.environ["PATH"], "IMGATE_SECRETS_DIR": str(secrets),
           "IM_AUTH_SECRET": "{secret:im_auth_secret}", "HOME": str(secrets)}
    done = subprocess.run([sys.executable, str(ENTRYPOINT), "token", "alice", "--ttl", "60"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    claims = jwt.decode(done.stdout.strip(), "s" * 40, algorithms=["HS256"])
    assert claims["sub"] == "alice"

    env["IM_AUTH_SECRET"] = "{secret:nope}"
    done = subprocess.run([sys.executable, str(ENTRYPOINT), "token", "alice"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert done.returncode == 2 and "IM_AUTH_SECRET: cannot read secret 'nope'" in done.stderr
