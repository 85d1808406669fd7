#!/usr/bin/env bash
# Create/refresh the project venv (.venv), install the locked dependencies
# (requirements-dev.lock: runtime + test extra + the SDK's; bash scripts/lock.sh
# regenerates it) and the project on top without resolving anything, the
# test tooling (Docker Compose's CLI for `docker compose config`, Debian's
# chromium and playwright-core for the browser test), then make sure the
# local servers (Redis, RabbitMQ, Mongo-compatible) are up via
# scripts/services.sh. Safe to run repeatedly, from any cwd.
#
#   bash scripts/setup.sh             # everything the tests need (what CI runs)
#   bash scripts/setup.sh --runtime   # only what a node needs (scripts/up.sh):
#       requirements.lock and the project; SecantusDB (the MongoDB-compatible
#       local server, with its own dependencies at the dev lock's hashes) only
#       when nothing answers on the MongoDB port; no test tooling
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
RUNTIME=0
case "${1:-}" in
"") ;;
--runtime) RUNTIME=1 ;;
*) echo "setup.sh: unknown argument '$1' (--runtime, or nothing)" >&2; exit 2 ;;
esac

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

if ((RUNTIME)); then
    echo "setup: installing the runtime dependencies (requirements.lock) and the project into .venv"
    # Quiet: pip's and the build backend's notices only if the install fails.
    quiet() {
        local out
        out="$("$@" 2>&1)" || { printf '%s\n' "$out" >&2; return 1; }
    }
    quiet .venv/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes \
        -r requirements.lock
    quiet .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
        --no-build-isolation -e .
    if ! timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/${MONGO_PORT:-27017}" 2>/dev/null \
        && [[ ! -x .venv/bin/secantusd-py ]]; then
        echo "setup: nothing answers on 127.0.0.1:${MONGO_PORT:-27017}: installing SecantusDB" \
            "(a MongoDB-compatible server) into .venv"
        # Its block and its dependencies' from the dev lock, hashes included.
        store_lock="$(mktemp)"
        .venv/bin/python - requirements-dev.lock "$store_lock" <<'PY'
import re, sys
wanted = {"secantusdb", "python-dateutil", "six", "s2sphere", "shapely", "numpy"}
blocks = re.split(r"\n(?=[a-z0-9])", open(sys.argv[1]).read())
with open(sys.argv[2], "w") as out:
    for b in blocks:
        if b.split("==", 1)[0].strip().lower() in wanted:
            out.write(b.rstrip() + "\n")
PY
        quiet .venv/bin/python -m pip install --quiet --disable-pip-version-check \
            --require-hashes --no-deps -r "$store_lock"
        rm -f "$store_lock"
    fi
    .venv/bin/python -m pip check >/dev/null
    bash scripts/services.sh
    exit 0
fi

.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
echo "setup: installing the locked dependencies and the project into .venv"
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
