"""No public default secret: a node started without IM_AUTH_SECRET uses the random
secret in its local file (shared with ``python -m gateway token``) and refuses
a token signed with the old published development value; IM_ENV=production
refuses to start without a secret."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import time

import httpx
import jwt
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from testkit.nodes import REPO, NodeProcess, node_env
from tests.conftest import RUN_NS, uid

OLD_DEV_SECRET = "dev-only-secret-change-me-0123456789"


async def gateway_cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", *args, cwd=REPO, env={**os.environ, **env},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
async def secretless(tmp_path, mongo_db):
    """A node process with no IM_AUTH_SECRET and its own secret file."""
    env = node_env(namespace=RUN_NS, ws_port=0, http_port=0, metrics_port=0, auth_secret="",
                   auth_secret_file=tmp_path / "state" / "auth_secret")
    proc = NodeProcess(env)
    try:
        yield await proc.start(), env, tmp_path / "state" / "auth_secret"
    finally:
        await proc.stop(grace_s=5)


async def test_a_node_without_a_secret_refuses_the_old_development_secret(secretless):
    proc, env, path = secretless
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "IM_AUTH_SECRET is unset" in proc.log_tail()
    now = int(time.time())
    forged = jwt.encode({"sub": "admin", "iat": now, "exp": now + 600}, OLD_DEV_SECRET, "HS256")
    async with httpx.AsyncClient(base_url=proc.http_url) as c:
        r = await c.get("/v1/conversations", headers={"Authorization": f"Bearer {forged}"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    with pytest.raises(InvalidStatus) as info:
        async with ws_connect(f"{proc.ws_url}?token={forged}"):
            pass
    assert info.value.response.status_code == 401

    # `python -m gateway token` signs with the same local secret: accepted.
    rc, out, err = await gateway_cli("token", uid(), env=env)
    assert rc == 0 and "local secret" in err
    async with httpx.AsyncClient(base_url=proc.http_url) as c:
        r = await c.get("/v1/conversations", headers={"Authorization": f"Bearer {out.strip()}"})
        assert r.status_code == 200
    async with ws_connect(f"{proc.ws_url}?token={out.strip()}"):
        pass


async def test_production_refuses_to_start_without_a_secret(tmp_path):
    env = node_env(env="production", auth_secret="", auth_secret_file=tmp_path / "s",
                   ws_port=0, http_port=0, metrics_port=0)
    rc, out, err = await gateway_cli("serve", env=env)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "IM_ENV=production needs IM_AUTH_SECRET" in err
    assert not (tmp_path / "s").exists()


async def test_the_old_development_secret_cannot_be_configured(tmp_path):
    rc, _, err = await gateway_cli("serve", env=node_env(auth_secret=OLD_DEV_SECRET, ws_port=0,
                                                         http_port=0, metrics_port=0))
    assert rc == 2 and "published development value" in err


async def test_token_command_refuses_a_lifetime_over_the_maximum(tmp_path):
    env = node_env(auth_secret="", auth_secret_file=tmp_path / "s", auth_max_ttl_s=3600)
    rc, out, err = await gateway_cli("token", "alice", "--ttl", "7200", env=env)
    assert rc == 2 and out == "" and "IM_AUTH_MAX_TTL_S" in err
    rc, out, _ = await gateway_cli("token", "alice", env=env)  # default: capped at the max
    claims = jwt.decode(out.strip(), options={"verify_signature": False})
    assert rc == 0 and claims["exp"] - claims["iat"] == 3600
