"""The SDKs install the way their READMEs say: the JavaScript SDK packs with
``npm pack`` into a tarball that installs in a clean directory and imports
(its type declarations inside, a WebSocket implementation passed in where
the runtime has none); the Python SDK builds a wheel that installs into a
clean venv and imports. Each under the project's licence."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LICENSE = (ROOT / "LICENSE").read_text()


def run(*cmd: str | Path, cwd: Path, timeout: float = 180) -> str:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                         timeout=timeout, check=False)
    assert out.returncode == 0, f"{cmd}: {out.stdout}\n{out.stderr}"
    return out.stdout


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")
def test_the_js_sdk_packs_installs_and_imports_in_a_clean_directory(tmp_path):
    meta = json.loads((ROOT / "clients/js/package.json").read_text())
    assert meta["license"] == "Apache-2.0" and not meta.get("private")
    run("npm", "pack", "--silent", "--pack-destination", tmp_path, cwd=ROOT / "clients/js")
    tarball = tmp_path / f"imgate-client-{meta['version']}.tgz"
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    assert {"package/src/imgate.js", "package/src/imgate.d.ts", "package/LICENSE"} <= names
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text('{"name": "app", "private": true, "type": "module"}')
    run("npm", "install", "--offline", "--no-audit", "--no-fund", "--silent", tarball, cwd=app)
    # Plain node, no --experimental-websocket: the application hands the SDK a
    # WebSocket implementation (here a stand-in that records the URL it was given).
    script = """
import { ImClient, ImError } from "imgate-client";
class Socket { constructor(url) { Socket.urls.push(url); } close() {} send() {} }
Socket.urls = [];
const c = new ImClient({ url: "ws://127.0.0.1:9/ws", token: "t", WebSocket: Socket });
c.connect().catch(() => {});
await new Promise((r) => setTimeout(r, 50));
c.close();
console.log(JSON.stringify({ urls: Socket.urls, error: typeof ImError }));
"""
    got = json.loads(run("node", "--input-type=module", "-e", script, cwd=app).strip())
    assert got["error"] == "function" and got["urls"][0].startswith("ws://127.0.0.1:9/ws")
    installed = app / "node_modules/imgate-client"
    assert json.loads((installed / "package.json").read_text())["types"] == "./src/imgate.d.ts"
    assert (installed / "LICENSE").read_text() == LICENSE


def test_the_python_sdk_builds_a_wheel_that_installs_in_a_clean_venv(tmp_path):
    assert (ROOT / "clients/python/LICENSE").read_text() == LICENSE
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
        "-w", tmp_path / "dist", ROOT / "clients/python", cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("imgate_client-*.whl"))
    run(sys.executable, "-m", "venv", tmp_path / "venv", cwd=tmp_path)
    python = tmp_path / "venv/bin/python"
    # Its two dependencies come from the index (or pip's cache), as for a user.
    run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel,
        cwd=tmp_path, timeout=300)
    out = run(python, "-c", "import importlib.metadata as m, imgate_client as c; "
              "print(c.__version__, m.metadata('imgate-client')['License-Expression'], "
              "c.Client.__name__, c.__file__)", cwd=tmp_path)
    version, licence, client, where = out.split()
    assert (version, licence, client) == ("0.1.0", "Apache-2.0", "Client")
    assert where.startswith(str(tmp_path / "venv"))


def test_every_manifest_names_the_licence_of_the_license_file():
    assert LICENSE.lstrip().startswith("Apache License\n                           Version 2.0")
    for manifest in ("pyproject.toml", "clients/python/pyproject.toml"):
        text = (ROOT / manifest).read_text()
        assert 'license = "Apache-2.0"' in text and 'license-files = ["LICENSE"]' in text
        assert "license = {" not in text  # the deprecated table form
