#!/usr/bin/env bash
# Create/refresh the project venv (.venv), install the locked dependencies
# (requirements-dev.lock: runtime + test extra + the SDK's; bash scripts/lock.sh
# regenerates it) and the project on top without resolving anything, then make
# sure the local servers (Redis, RabbitMQ, Mongo-compatible) are up via
# scripts/services.sh. Safe to run repeatedly, from any cwd.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"

if [[ ! -x .venv/bin/python ]]; then
    echo "setup: creating .venv with $PYTHON"
    if ! "$PYTHON" -m venv .venv; then
        # Debian splits ensurepip out of the interpreter package.
        echo "setup: '$PYTHON -m venv' failed; installing python3-venv" >&2
        rm -rf .venv
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
        "$PYTHON" -m venv .venv
    fi
fi

echo "setup: installing the locked dependencies and the project into .venv"
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
# Exactly the locked set (hashes checked), the build backend included; then the
# project and the Python client SDK (its own package: tests, bench and loadtest
# use it) with no resolution and no build dependency fetched.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes \
    -r requirements-dev.lock
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation -e . -e clients/python
.venv/bin/python -m pip check

# Docker Compose v2 for `docker compose config` (tests/deploy; no engine needed).
bash scripts/compose_cli.sh

# The demo's browser test (tests/browser): Debian's chromium (no browser
# download) driven by playwright-core from npm.
if [[ ! -x /usr/bin/chromium ]]; then
    echo "setup: installing chromium"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq  # stale package lists: once
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
fi
if command -v npm >/dev/null; then
    lock_sum="$(sha256sum tests/browser/package-lock.json | cut -d' ' -f1)"
    if [[ ! -d tests/browser/node_modules ]] \
        || [[ "$(cat tests/browser/node_modules/.lock-sum 2>/dev/null)" != "$lock_sum" ]]; then
        echo "setup: npm ci in tests/browser"
        (cd tests/browser && npm ci --silent --no-audit --no-fund)
        echo "$lock_sum" > tests/browser/node_modules/.lock-sum
    fi
else
    echo "setup: npm not found: the browser test (tests/browser) cannot run" >&2
fi

echo "setup: starting services"
bash scripts/services.sh
