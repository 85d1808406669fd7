#!/usr/bin/env bash
# Create/refresh the project venv (.venv), install the project with its test
# extra, then make sure the local servers (Redis, RabbitMQ, Mongo-compatible)
# are up via scripts/services.sh. Safe to run repeatedly, from any cwd.
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

echo "setup: installing project into .venv"
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'

echo "setup: starting services"
bash scripts/services.sh
