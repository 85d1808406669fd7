#!/usr/bin/env bash
# Bring up a working node on this machine: install into .venv, start the local
# servers that are missing (Redis, RabbitMQ, the MongoDB-compatible server),
# then run one gateway node in the foreground (Ctrl-C drains and stops it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec .venv/bin/python -m gateway serve
