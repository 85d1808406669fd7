#!/usr/bin/env bash
# Bring up a working node on this machine, in the foreground: install what a
# node needs into .venv (scripts/setup.sh --runtime: requirements.lock, and the
# MongoDB-compatible local server only when no MongoDB answers), start the
# local servers that are missing (Redis, RabbitMQ, SecantusDB), then run one
# gateway node. Ctrl-C drains the node, then stops the servers this run
# started (servers that were already running are left alone).
#
#   bash scripts/up.sh           # ws :8080, http :8081 (the demo at /demo/)
#   bash scripts/up.sh --fresh   # the local store starts empty
#   IM_WS_PORT=8090 IM_HTTP_PORT=8091 IM_METRICS_PORT=9474 bash scripts/up.sh   # a second node
#   bash scripts/down.sh         # stop what an up.sh left running (sent to the background)
#
# The local store keeps its data in $XDG_STATE_HOME/imgate/secantus (default
# ~/.local/state/imgate/secantus; IM_MONGO_DATA to choose), so messages survive
# a restart; the token secret of `python -m gateway token` is kept beside it.
# Nothing else is written outside the checkout and .venv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fresh=0
for arg in "$@"; do
    case "$arg" in
    --fresh) fresh=1 ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "up.sh: unknown argument '$arg' (--fresh, --help)" >&2; exit 2 ;;
    esac
done

state="${XDG_STATE_HOME:-$HOME/.local/state}/imgate"
mkdir -p "$state"
mongo_data="${IM_MONGO_DATA:-$state/secantus}"
# What this run starts (scripts/services.sh records it), for Ctrl-C and down.sh.
run="$state/up-${IM_HTTP_PORT:-8081}"
started_file="$run.started"
if ((fresh)); then
    if timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/${MONGO_PORT:-27017}" 2>/dev/null; then
        echo "up.sh: --fresh: a store already answers on 127.0.0.1:${MONGO_PORT:-27017};" \
            "stop it first (bash scripts/down.sh)" >&2
        exit 2
    fi
    echo "up.sh: --fresh: emptying $mongo_data"
    rm -rf "$mongo_data"
fi

stop_started() {
    trap - EXIT INT TERM
    rm -f "$run.pid"
    bash scripts/services.sh stop "$started_file"
}
trap stop_started EXIT
trap 'exit 130' INT TERM

IM_MONGO_DATA="$mongo_data" IM_STARTED_FILE="$started_file" bash scripts/setup.sh --runtime
if grep -qs '^mongo ' "$started_file"; then
    echo "up.sh: the local store's data: $mongo_data"
else
    echo "up.sh: a MongoDB already answers on 127.0.0.1:${MONGO_PORT:-27017}: the node uses it"
fi
echo "up.sh: Ctrl-C drains the node and stops the servers this run started"
.venv/bin/python -m gateway serve &
node=$!
echo "$node" >"$run.pid"
# The node drains on SIGINT/SIGTERM; this script waits for it, then cleans up.
trap 'kill -TERM "$node" 2>/dev/null; wait "$node"; exit 130' INT TERM
wait "$node"
