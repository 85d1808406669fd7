"""The demo web app (``web/demo``, served at ``/demo/``) in a real browser.

Two in-process nodes; ``tests/browser/demo.test.mjs`` drives Debian's chromium
with playwright-core: user A on node 1 and B on node 2 chat, B goes away and
catches up, both meet in a live room, A posts to the feed (steps in the
script). Needs ``/usr/bin/chromium`` and ``tests/browser/node_modules``
(``scripts/setup.sh`` installs both): missing, the test fails rather than
skips, so CI really runs it."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path

import httpx
import pytest

from tests.conftest import NodeFactory, settle, token, uid

REPO = Path(__file__).resolve().parents[3]
BROWSER_DIR = REPO / "tests" / "browser"
SCRIPT = BROWSER_DIR / "demo.test.mjs"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
TIMEOUT_S = 90  # the script bounds itself at 55 s; this is the backstop


def _prerequisites() -> None:
    missing = []
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
        missing.append(f"{CHROMIUM} (apt-get install -y chromium)")
    if shutil.which("node") is None:
        missing.append("node (nodejs)")
    if not (BROWSER_DIR / "node_modules" / "playwright-core").is_dir():
        missing.append("tests/browser/node_modules (cd tests/browser && npm ci)")
    if missing:
        pytest.fail("the browser test needs " + ", ".join(missing)
                    + ": run scripts/setup.sh", pytrace=False)


async def test_demo_is_served_without_a_token(make_node: NodeFactory) -> None:
    n = await make_node()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{n.http_port}") as c:
        page = await c.get("/demo/")
        assert page.status_code == 200 and 'data-test="status"' in page.text
        moved = await c.get("/demo?token=t&ws=ws://h:1/ws")
        assert moved.status_code == 307
        assert moved.headers["location"] == "/demo/?token=t&ws=ws://h:1/ws"
        for path in ("/demo/demo.js", "/demo/sdk/imgate.js"):
            js = await c.get(path)
            assert js.status_code == 200, path
            assert "javascript" in js.headers["content-type"], path
        assert (await c.get("/demo/../gateway/http_api.py")).status_code == 404
        assert (await c.get("/demo/sdk/../../../README.md")).status_code == 404
        paths = (await c.get("/openapi.json")).json()["paths"]
        assert not [p for p in paths if p.startswith("/demo")]


@pytest.mark.edge_only
async def test_demo_in_a_browser(make_node: NodeFactory) -> None:
    _prerequisites()
    n1, n2 = await make_node(), await make_node()
    await settle(n1, n2)
    a, b = uid("alice"), uid("bob")
    env = {**os.environ, "CHROMIUM": CHROMIUM,
           "IMGATE_HTTP_1": f"http://127.0.0.1:{n1.http_port}",
           "IMGATE_WS_1": f"ws://127.0.0.1:{n1.ws_port}/ws",
           "IMGATE_HTTP_2": f"http://127.0.0.1:{n2.http_port}",
           "IMGATE_WS_2": f"ws://127.0.0.1:{n2.ws_port}/ws",
           "IMGATE_USER_A": a, "IMGATE_TOKEN_A": token(a),
           "IMGATE_USER_B": b, "IMGATE_TOKEN_B": token(b)}
    # The nodes run in this event loop: wait for the browser without blocking it.
    proc = await asyncio.create_subprocess_exec(
        "node", str(SCRIPT), cwd=BROWSER_DIR, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True)  # its own process group: chromium goes with it
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = await proc.communicate()
        pytest.fail(f"demo.test.mjs ran over {TIMEOUT_S} s:\n{out.decode(errors='replace')}",
                    pytrace=False)
    text = out.decode(errors="replace")
    print(text)  # the steps and their times (pytest shows it with -s, or on failure)
    assert proc.returncode == 0, f"demo.test.mjs exited {proc.returncode}:\n{text}"
