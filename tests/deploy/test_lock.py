"""The locks (scripts/lock.sh) cover pyproject.toml: every dependency pinned,
with hashes, at a version its range allows; the image's lock is at the
versions CI installs; setup.sh (CI) and the Dockerfile install from them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.deploy.conftest import REPO

# The interpreter the locks are made for and installed on (CI, the image).
TARGET = {"python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux",
          "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "platform_machine": "x86_64"}


def pyproject(path: Path) -> dict:
    with path.open("rb") as f:
        return tomllib.load(f)


PROJECT = pyproject(REPO / "pyproject.toml")
SDK = pyproject(REPO / "clients" / "python" / "pyproject.toml")
BUILD = PROJECT["build-system"]["requires"]
RUNTIME = PROJECT["project"]["dependencies"]
EXTRAS = PROJECT["project"]["optional-dependencies"]

LOCKS = {
    "requirements.lock": [*RUNTIME, *BUILD],
    "requirements-dev.lock": [*RUNTIME, *EXTRAS["test"], *SDK["project"]["dependencies"],
                              *BUILD],
    "requirements-bench.lock": [*RUNTIME, *EXTRAS["test"], *EXTRAS["bench"],
                                *SDK["project"]["dependencies"], *BUILD],
}


def pins(lock: str) -> dict[str, Version]:
    """name -> the version installed on the target interpreter."""
    text = (REPO / lock).read_text()
    out: dict[str, Version] = {}
    for entry in re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2]):
        head = entry.split("\\", 1)[0].strip()
        if not head or head.startswith("#"):
            continue
        spec, _, marker = head.partition(";")
        pinned = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)(==)(\S+)", spec.strip())
        assert pinned is not None, f"{lock}: {spec.strip()!r} is not pinned with =="
        name, op, ver = pinned.groups()
        assert "--hash=sha256:" in entry, f"{lock}: {name} has no hash"
        if marker.strip() and not Marker(marker.strip()).evaluate(TARGET):
            continue
        assert canonicalize_name(name) not in out, f"{lock}: {name} twice for the target"
        out[canonicalize_name(name)] = Version(ver)
    return out


@pytest.mark.parametrize("lock", list(LOCKS))
def test_lock_covers_pyproject(lock: str) -> None:
    pinned = pins(lock)
    for raw in LOCKS[lock]:
        req = Requirement(raw)
        if req.marker and not req.marker.evaluate(TARGET):
            continue
        name = canonicalize_name(req.name)
        assert name in pinned, f"{lock}: {req.name} not locked: run bash scripts/lock.sh"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{lock}: {req.name}=={pinned[name]} outside {req.specifier}: run bash scripts/lock.sh")


def test_image_runs_what_ci_installs() -> None:
    dev, image, bench = (pins(n) for n in ("requirements-dev.lock", "requirements.lock",
                                          "requirements-bench.lock"))
    assert set(image) <= set(dev)
    assert {n: v for n, v in image.items() if dev[n] != v} == {}
    assert {n: v for n, v in dev.items() if bench.get(n) != v} == {}


def test_installs_use_the_locks() -> None:
    setup = (REPO / "scripts" / "setup.sh").read_text().replace("\\\n", " ")
    assert re.search(r"pip install [^\n]*--require-hashes\s+-r requirements-dev\.lock", setup)
    assert re.search(r"pip install [^\n]*--no-deps\s+--no-build-isolation -e \. "
                     r"-e clients/python", setup)
    assert "'.[test]'" not in setup  # no resolution from pyproject's ranges
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash scripts/setup.sh" in ci
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "pip install --require-hashes -r requirements.lock" in dockerfile
    lock_sh = (REPO / "scripts" / "lock.sh").read_text()
    for lock in LOCKS:
        assert f"compile {lock}" in lock_sh
