#!/usr/bin/env bash
# Idempotently make sure the local backing servers are up:
#   Redis     127.0.0.1:6379
#   RabbitMQ  127.0.0.1:5672 (guest/guest)
#   SecantusDB (MongoDB-compatible) 127.0.0.1:${MONGO_PORT:-27017}
# A server whose port already accepts TCP connections is left alone.
# Prints one line per service saying what was done. Exits 1 on failure.
#
# Environment:
#   MONGO_PORT       port for the Mongo-compatible server (default 27017)
#   IM_MONGO_DATA    storage dir for it (default: a fresh mktemp dir in /tmp)
#   SERVICE_TIMEOUT  seconds to wait for each server to come up (default 60)
#   IM_STARTED_FILE  if set, a line per server this run started is appended to
#                    it ("redis PORT", "rabbitmq", "mongo PID DATA"), for
#   bash scripts/services.sh stop FILE   which stops those (and only those)
#   bash scripts/services.sh mongo       only the Mongo-compatible server
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

MONGO_PORT="${MONGO_PORT:-27017}"
SERVICE_TIMEOUT="${SERVICE_TIMEOUT:-60}"
APT_UPDATED=0

log() { printf '%s\n' "$*"; }
started() { [[ -z "${IM_STARTED_FILE:-}" ]] || printf '%s\n' "$*" >>"$IM_STARTED_FILE"; }
die() { printf 'services.sh: ERROR: %s\n' "$*" >&2; exit 1; }

# port_open PORT -> 0 if 127.0.0.1:PORT accepts a TCP connection
port_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# wait_port PORT [CHECK_CMD...] -> waits until PORT accepts (and CHECK_CMD
# succeeds, if given), at most SERVICE_TIMEOUT seconds.
wait_port() {
    local port="$1"
    shift
    local deadline=$((SECONDS + SERVICE_TIMEOUT))
    while ((SECONDS < deadline)); do
        if port_open "$port" && { (($# == 0)) || "$@" >/dev/null 2>&1; }; then
            return 0
        fi
        sleep 1
    done
    return 1
}

apt_install() {
    command -v apt-get >/dev/null 2>&1 || die "apt-get not available; install $* manually"
    if ((APT_UPDATED == 0)); then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_redis() {
    local port=6379 installed=""
    if port_open "$port"; then
        log "redis:    already listening on 127.0.0.1:$port, nothing to do"
        return
    fi
    if ! command -v redis-server >/dev/null 2>&1; then
        apt_install redis-server
        installed="installed redis-server, "
        if port_open "$port"; then   # the package may have started it
            log "redis:    ${installed}now listening on 127.0.0.1:$port"
            return
        fi
    fi
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
        --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log >/dev/null
    if ! wait_port "$port" redis-cli -p "$port" ping; then
        tail -n 20 /var/log/redis/ci.log >&2 2>/dev/null || true
        die "redis did not accept connections on 127.0.0.1:$port within ${SERVICE_TIMEOUT}s (log: /var/log/redis/ci.log)"
    fi
    started "redis $port"
    log "redis:    ${installed}started, listening on 127.0.0.1:$port"
}

rabbit_ready() {
    timeout 20 rabbitmqctl -q -t 15 await_startup
}

ensure_rabbitmq() {
    local port=5672 installed=""
    if port_open "$port"; then
        log "rabbitmq: already listening on 127.0.0.1:$port, nothing to do"
        return
    fi
    if ! command -v rabbitmq-server >/dev/null 2>&1; then
        apt_install rabbitmq-server
        installed="installed rabbitmq-server, "
        # the package may have started it; give it a moment before starting our own
        if SERVICE_TIMEOUT=20 wait_port "$port" rabbit_ready; then
            log "rabbitmq: ${installed}now listening on 127.0.0.1:$port"
            return
        fi
    fi
    rabbitmq-server -detached >/dev/null 2>&1 || true   # fails if the node already runs; the wait decides
    if ! wait_port "$port" rabbit_ready; then
        die "rabbitmq did not accept connections on 127.0.0.1:$port within ${SERVICE_TIMEOUT}s (logs: /var/log/rabbitmq/)"
    fi
    started "rabbitmq"
    log "rabbitmq: ${installed}started, listening on 127.0.0.1:$port"
}

ensure_mongo() {
    local port="$MONGO_PORT" bin data pid
    if port_open "$port"; then
        log "mongo:    already listening on 127.0.0.1:$port, nothing to do"
        return
    fi
    if [[ -x .venv/bin/secantusd-py ]]; then
        bin="$PWD/.venv/bin/secantusd-py"
    elif command -v secantusd-py >/dev/null 2>&1; then
        bin="$(command -v secantusd-py)"
    else
        die "secantusd-py not found in .venv/bin or PATH (run scripts/setup.sh, which installs requirements-dev.lock)"
    fi
    data="${IM_MONGO_DATA:-$(mktemp -d /tmp/secantus.XXXXXX)}"
    mkdir -p "$data"
    data="$(cd "$data" && pwd)"
    nohup "$bin" --port "$port" --storage-path "$data" >"$data/secantus.log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$data/secantus.pid"
    local deadline=$((SECONDS + SERVICE_TIMEOUT))
    until port_open "$port"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$data/secantus.log" >&2 || true
            die "secantusd-py exited before listening on 127.0.0.1:$port (log: $data/secantus.log)"
        fi
        if ((SECONDS >= deadline)); then
            tail -n 20 "$data/secantus.log" >&2 || true
            die "secantusd-py did not accept connections on 127.0.0.1:$port within ${SERVICE_TIMEOUT}s (log: $data/secantus.log)"
        fi
        sleep 0.5
    done
    started "mongo $pid $data"
    log "mongo:    started secantusd-py (pid $pid) on 127.0.0.1:$port, data $data, log $data/secantus.log"
}

# stop FILE: the servers FILE says a run started, newest first; FILE removed.
stop_started() {
    local file="$1" what arg1 arg2
    [[ -f "$file" ]] || return 0
    tac "$file" | while read -r what arg1 arg2; do
        case "$what" in
        redis)
            redis-cli -p "$arg1" shutdown nosave >/dev/null 2>&1 || true
            log "redis:    stopped (127.0.0.1:$arg1)" ;;
        rabbitmq)
            rabbitmqctl -q stop >/dev/null 2>&1 || true
            log "rabbitmq: stopped" ;;
        mongo)
            if kill "$arg1" 2>/dev/null; then
                for _ in $(seq 1 100); do kill -0 "$arg1" 2>/dev/null || break; sleep 0.1; done
            fi
            rm -f "$arg2/secantus.pid"
            log "mongo:    stopped secantusd-py (pid $arg1); its data stays in $arg2" ;;
        esac
    done
    rm -f "$file"
}

if [[ "${1:-}" == stop ]]; then
    [[ -n "${2:-}" ]] || die "usage: services.sh stop FILE"
    stop_started "$2"
    exit 0
fi
if [[ "${1:-}" == mongo ]]; then  # the Mongo-compatible server only (a test pass's own)
    ensure_mongo
    exit 0
fi
ensure_redis
ensure_rabbitmq
ensure_mongo
