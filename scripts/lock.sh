#!/usr/bin/env bash
# Regenerate the dependency locks from pyproject.toml (and the Python SDK's,
# clients/python/pyproject.toml): every package pinned with its hashes, for
# CPython 3.11 (the image's and CI's), resolved by uv (a pinned release, kept
# in a tool venv of its own, not in the locks).
#
#   requirements-dev.lock    the runtime dependencies + the `test` extra + the
#                            SDK's + the build backend: what scripts/setup.sh
#                            (and so CI) installs into .venv
#   requirements.lock        the runtime dependencies + the build backend, at
#                            the dev lock's versions: what the Docker image installs
#   requirements-bench.lock  requirements-dev.lock + the `bench` extra, at the
#                            dev lock's versions: the benchmarks
#
#   bash scripts/lock.sh                        # after editing dependencies: keeps every pin that still fits
#   bash scripts/lock.sh --upgrade              # the upgrade: everything to its newest allowed version
#   bash scripts/lock.sh --upgrade-package X    # one package (repeatable)
#
# Then `bash scripts/setup.sh` installs the new set into .venv; run the tests
# and commit the .lock files with the change. tests/deploy/test_lock.py fails
# while a dependency of pyproject.toml is missing from a lock.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

UV_VERSION=0.13.9
PYTHON="${PYTHON:-python3}"
TOOLS="${IMGATE_LOCK_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/imgate/lock-tools}"

if [[ "$("$TOOLS/bin/uv" --version 2>/dev/null)" != "uv $UV_VERSION"* ]]; then
    echo "lock: installing uv $UV_VERSION into $TOOLS"
    rm -rf "$TOOLS"
    "$PYTHON" -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi

build_requires="$(mktemp)"
trap 'rm -f "$build_requires"' EXIT
# The build backend (pyproject's [build-system] requires) is locked too: the
# project is installed with --no-build-isolation, so nothing unlocked is fetched.
"$PYTHON" - >"$build_requires" <<'EOF'
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["build-system"]["requires"]))
EOF

compile() {  # OUTPUT ARGS...: one lock
    local out="$1"
    shift
    echo "lock: $out"
    "$TOOLS/bin/uv" pip compile --quiet --universal --python-version 3.11 --generate-hashes \
        --custom-compile-command "bash scripts/lock.sh" --output-file "$out" "$@" \
        - <"$build_requires"
}

compile requirements-dev.lock --extra test pyproject.toml clients/python/pyproject.toml "$@"
compile requirements.lock pyproject.toml --constraints requirements-dev.lock "$@"
compile requirements-bench.lock --extra test --extra bench pyproject.toml \
    clients/python/pyproject.toml --constraints requirements-dev.lock "$@"
