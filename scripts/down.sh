#!/usr/bin/env bash
# Stop what `bash scripts/up.sh` started and left running (sent to the
# background, or its terminal gone): the node (drained with SIGTERM), then the
# local servers that run started. Servers it found already running stay up;
# the local store's data stays in $XDG_STATE_HOME/imgate/secantus.
#
#   bash scripts/down.sh                      # the node on IM_HTTP_PORT (8081)
#   IM_HTTP_PORT=8091 bash scripts/down.sh    # another one
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

run="${XDG_STATE_HOME:-$HOME/.local/state}/imgate/up-${IM_HTTP_PORT:-8081}"
if [[ -f "$run.pid" ]]; then
    node="$(cat "$run.pid")"
    if kill -TERM "$node" 2>/dev/null; then
        echo "down.sh: draining the node (pid $node)"
        for _ in $(seq 1 300); do kill -0 "$node" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$run.pid"
fi
# (When up.sh itself is still alive, it cleans up after its node and this finds nothing.)
sleep 0.5
if [[ -f "$run.started" ]]; then
    bash scripts/services.sh stop "$run.started"
else
    echo "down.sh: nothing recorded as started by scripts/up.sh (IM_HTTP_PORT=${IM_HTTP_PORT:-8081})"
fi
