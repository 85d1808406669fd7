#!/usr/bin/env bash
# A private local Redis Cluster for tests and benchmarks: 3 masters, no
# replicas, on 127.0.0.1 ports BASE+1..BASE+3 (REDIS_CLUSTER_PORT_BASE,
# default 7000), each with its own data dir under DIR and no persistence.
# It never touches the machine's shared Redis on 6379.
#
#   bash scripts/redis_cluster.sh start [DIR]       # prints the seed URLs
#   bash scripts/redis_cluster.sh stop [DIR]        # stops all, removes DIR (KEEP=1 keeps it)
#   bash scripts/redis_cluster.sh status [DIR]
#   bash scripts/redis_cluster.sh stop-node N [DIR] # kill master N (1..3): a failure test
#   bash scripts/redis_cluster.sh start-node N [DIR]# bring it back with its node config
#
# `start` is idempotent: a cluster already answering `cluster_state:ok` is left alone.
set -euo pipefail

cmd="${1:-}"
case "$cmd" in
stop-node | start-node) DIR="${3:-/tmp/imgate-redis-cluster}" ;;
*) DIR="${2:-/tmp/imgate-redis-cluster}" ;;
esac
BASE="${REDIS_CLUSTER_PORT_BASE:-7000}"
PORTS=("$((BASE + 1))" "$((BASE + 2))" "$((BASE + 3))")
TIMEOUT="${SERVICE_TIMEOUT:-30}"

die() { printf 'redis_cluster.sh: ERROR: %s\n' "$*" >&2; exit 1; }
cli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

urls() {
    local out=() p
    for p in "${PORTS[@]}"; do out+=("redis://127.0.0.1:$p"); done
    (IFS=,; printf '%s\n' "${out[*]}")
}

cluster_ok() { cli "${PORTS[0]}" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; }

start_node() {  # start_node PORT
    local port="$1" dir="$DIR/$1"
    mkdir -p "$dir"
    if cli "$port" ping >/dev/null 2>&1; then return 0; fi
    redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --daemonize yes \
        --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
        --save '' --appendonly no --protected-mode yes --pidfile "$dir/redis.pid" \
        --logfile "$dir/redis.log" >/dev/null
    local deadline=$((SECONDS + TIMEOUT))
    until cli "$port" ping >/dev/null 2>&1; do
        ((SECONDS < deadline)) || { tail -20 "$dir/redis.log" >&2; die "port $port did not start"; }
        sleep 0.2
    done
}

stop_node() {  # stop_node PORT
    local port="$1"
    cli "$port" shutdown nosave >/dev/null 2>&1 || true
    local pidfile="$DIR/$port/redis.pid"
    if [[ -f "$pidfile" ]]; then
        local pid
        pid="$(cat "$pidfile")"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$pidfile"
    fi
}

wait_ok() {
    local deadline=$((SECONDS + TIMEOUT))
    until cluster_ok; do
        ((SECONDS < deadline)) || die "cluster state not ok after ${TIMEOUT}s"
        sleep 0.2
    done
}

node_port() {  # node_port N -> the port of master N (1..3)
    [[ "${1:-}" =~ ^[1-3]$ ]] || die "node number must be 1, 2 or 3"
    printf '%s\n' "${PORTS[$(($1 - 1))]}"
}

case "$cmd" in
start)
    command -v redis-server >/dev/null || die "redis-server is not installed"
    if cluster_ok; then
        echo "redis cluster: already up"
    else
        for p in "${PORTS[@]}"; do start_node "$p"; done
        if ! cli "${PORTS[0]}" cluster info | grep -q '^cluster_known_nodes:3'; then
            redis-cli --cluster create "${PORTS[@]/#/127.0.0.1:}" --cluster-replicas 0 \
                --cluster-yes >/dev/null
        fi
        wait_ok
        echo "redis cluster: 3 masters up, data $DIR"
    fi
    echo "seeds: $(urls)"
    ;;
stop)
    for p in "${PORTS[@]}"; do stop_node "$p"; done
    [[ "${KEEP:-0}" == 1 ]] || rm -rf "$DIR"
    echo "redis cluster: stopped"
    ;;
status)
    cli "${PORTS[0]}" cluster info | grep -E '^cluster_(state|known_nodes|slots_ok)' || \
        echo "redis cluster: not running"
    ;;
stop-node)
    stop_node "$(node_port "${2:-}")"
    echo "redis cluster: master $2 stopped"
    ;;
start-node)
    start_node "$(node_port "${2:-}")"
    wait_ok
    echo "redis cluster: master $2 back"
    ;;
*)
    die "usage: redis_cluster.sh start|stop|status|stop-node N|start-node N [DIR]"
    ;;
esac
