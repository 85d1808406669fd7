#!/usr/bin/env bash
# Start/stop a private, local RabbitMQ cluster (3 nodes, or RMQ_CLUSTER_SIZE) for tests.
#
# Usage:
#   bash scripts/rabbitmq_cluster.sh start        [DIR]  start the cluster (idempotent)
#   bash scripts/rabbitmq_cluster.sh stop         [DIR]  stop all nodes, remove DIR (KEEP=1 keeps it)
#   bash scripts/rabbitmq_cluster.sh status       [DIR]  per-node state + cluster_status
#   bash scripts/rabbitmq_cluster.sh stop-node  N [DIR]  stop node N (HARD=1: SIGKILL it instead)
#   bash scripts/rabbitmq_cluster.sh start-node N [DIR]  (re)start node N; it rejoins by itself
#   bash scripts/rabbitmq_cluster.sh urls         [DIR]  print the comma-separated AMQP URLs
#
# Nodes imgate-rmq1..3@$RMQ_CLUSTER_HOST (default localhost), AMQP on
# 127.0.0.1:BASE+1..BASE+3, Erlang distribution on AMQP port + 20000 (bound to
# 127.0.0.1), CLI distribution ports BASE+40000..+10. No plugins at all (no
# management listener). `start` ends with the line
#   amqp URLs: amqp://guest:guest@127.0.0.1:5681/,...:5682/,...:5683/
# With RMQ_CLUSTER_SIZE=1 there is node 1 only (a single private broker, same
# commands: `stop-node 1` / `start-node 1` stop and restart it, its data kept).
#
# Environment:
#   RMQ_CLUSTER_SIZE       number of nodes: 1, 2 or 3 (default 3). `start`
#                          records it in DIR; later commands on DIR use the
#                          recorded size (and refuse a different RMQ_CLUSTER_SIZE)
#   RMQ_CLUSTER_PORT_BASE  base port (default 5680: AMQP ports 5681..5683)
#   RMQ_CLUSTER_HOST       host part of the node names (default localhost)
#   RMQ_CLUSTER_NAME_PREFIX node names are PREFIX1..3@HOST (default imgate-rmq,
#                          or imgate-rmq<BASE>- when the port base is not 5680,
#                          so that two clusters can run side by side)
#   RMQ_CLUSTER_TIMEOUT    seconds to wait for one node to boot/stop (default 60)
#   KEEP=1                 `stop` keeps DIR (data survives a later `start`)
#   HARD=1                 `stop-node` kills the node with SIGKILL (crash test)
#
# Everything lives under DIR (default /tmp/imgate-rmq-cluster): per-node
# mnesia/log/config/pid files, and DIR/home with the cluster's own random
# Erlang cookie. Every rabbitmq-server and rabbitmqctl call runs with a clean
# environment (env -i) whose HOME is DIR/home, so only that cookie is ever used.
#
# It NEVER touches the shared broker (rabbit@localhost on 5672), its data in
# /var/lib/rabbitmq, /etc/rabbitmq/*, /root/.erlang.cookie or epmd (4369,
# shared by design). It calls the real scripts in the package's bin dir, not
# Debian's /usr/sbin wrappers (those `su rabbitmq`, reset HOME to
# /var/lib/rabbitmq and so would use the shared cookie), and points
# RABBITMQ_CONF_ENV_FILE at a private file so /etc/rabbitmq/rabbitmq-env.conf
# (NODENAME=rabbit@localhost) is never read. Processes are found only through
# their pid files or an exact RABBITMQ_MNESIA_BASE=DIR/nodeN/mnesia in their
# environment; nothing is killed by name.
set -euo pipefail

usage() {
    sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

log() { printf '%s\n' "$*"; }
die() { printf 'rabbitmq_cluster.sh: ERROR: %s\n' "$*" >&2; exit 1; }

CMD="${1:-}"
[[ -n "$CMD" ]] || usage
shift
NODE_ARG=""
case "$CMD" in
    start-node | stop-node)
        NODE_ARG="${1:-}"
        [[ "$NODE_ARG" =~ ^[123]$ ]] || die "$CMD needs a node number 1, 2 or 3"
        shift
        ;;
esac
DIR="$(realpath -m "${1:-/tmp/imgate-rmq-cluster}")"
MARKER="$DIR/.imgate-rmq-cluster"
SIZE_FILE="$DIR/cluster-size"

# The number of nodes: the one recorded in DIR by `start` (a DIR made before
# sizes were recorded has 3), else RMQ_CLUSTER_SIZE, else 3.
SIZE="${RMQ_CLUSTER_SIZE:-}"
if [[ -n "$SIZE" ]] && ! [[ "$SIZE" =~ ^[123]$ ]]; then
    die "RMQ_CLUSTER_SIZE must be 1, 2 or 3 (got '$SIZE')"
fi
if [[ -f "$MARKER" ]]; then
    recorded=3
    [[ -s "$SIZE_FILE" ]] && recorded="$(tr -dc 0-9 <"$SIZE_FILE")"
    [[ "$recorded" =~ ^[123]$ ]] || die "$SIZE_FILE is damaged (want 1, 2 or 3)"
    if [[ -n "$SIZE" && "$SIZE" != "$recorded" ]]; then
        die "$DIR holds a $recorded-node cluster; RMQ_CLUSTER_SIZE=$SIZE does not match"
    fi
    SIZE="$recorded"
fi
SIZE="${SIZE:-3}"
if [[ -n "$NODE_ARG" ]] && ((NODE_ARG > SIZE)); then
    die "$CMD $NODE_ARG: the cluster in $DIR has $SIZE node(s)"
fi

PORT_BASE="${RMQ_CLUSTER_PORT_BASE:-5680}"
if ! [[ "$PORT_BASE" =~ ^[0-9]+$ ]] || ((PORT_BASE < 1 || PORT_BASE + 40010 > 65535)); then
    die "RMQ_CLUSTER_PORT_BASE must be a number from 1 to 25525"
fi
NODE_HOST="${RMQ_CLUSTER_HOST:-localhost}"
# Node names must differ between clusters that run at the same time (they all
# register with the one epmd), so a non-default port base changes them too.
if ((PORT_BASE == 5680)); then
    NAME_PREFIX="${RMQ_CLUSTER_NAME_PREFIX:-imgate-rmq}"
else
    NAME_PREFIX="${RMQ_CLUSTER_NAME_PREFIX:-imgate-rmq${PORT_BASE}-}"
fi
[[ "$NAME_PREFIX" =~ ^[A-Za-z0-9_-]+$ ]] || die "RMQ_CLUSTER_NAME_PREFIX may only use A-Z a-z 0-9 _ -"
TIMEOUT="${RMQ_CLUSTER_TIMEOUT:-60}"
NODES=()
for ((i = 1; i <= SIZE; i++)); do NODES+=("$i"); done
COOKIE="$DIR/home/.erlang.cookie"

# Refuse anything that could be the shared broker's files.
case "$DIR/" in
    / | /var/lib/rabbitmq/* | /etc/* | /root/ | /usr/* | /var/log/rabbitmq/*)
        die "refusing to use $DIR as the cluster directory" ;;
esac

# The package's real scripts (Debian: /usr/lib/rabbitmq/bin), not the wrappers.
if [[ -z "${RMQ_BIN_DIR:-}" ]]; then
    server_path="$(command -v rabbitmq-server || true)"
    [[ -n "$server_path" ]] || die "rabbitmq-server not found (apt-get install rabbitmq-server)"
    RMQ_BIN_DIR="$(dirname "$(readlink -f "$server_path")")"
fi
[[ -x "$RMQ_BIN_DIR/rabbitmq-server" && -x "$RMQ_BIN_DIR/rabbitmqctl" ]] ||
    die "no rabbitmq-server/rabbitmqctl in $RMQ_BIN_DIR (set RMQ_BIN_DIR)"

node_name() { printf '%s%s@%s' "$NAME_PREFIX" "$1" "$NODE_HOST"; }
amqp_port() { printf '%s' $((PORT_BASE + $1)); }
dist_port() { printf '%s' $((PORT_BASE + $1 + 20000)); }
node_dir() { printf '%s/node%s' "$DIR" "$1"; }
amqp_url() { printf 'amqp://guest:guest@127.0.0.1:%s/' "$(amqp_port "$1")"; }

# node_env N: fills NODE_ENV with the complete environment for node N.
node_env() {
    local n="$1" nd
    nd="$(node_dir "$n")"
    NODE_ENV=(
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
        HOME="$DIR/home"
        LANG=C.UTF-8
        LC_ALL=C.UTF-8
        ERL_EPMD_ADDRESS=127.0.0.1
        ERL_CRASH_DUMP="$nd/erl_crash.dump"
        RABBITMQ_CONF_ENV_FILE="$DIR/rabbitmq-env.conf"
        RABBITMQ_NODENAME="$(node_name "$n")"
        RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
        RABBITMQ_NODE_PORT="$(amqp_port "$n")"
        RABBITMQ_DIST_PORT="$(dist_port "$n")"
        RABBITMQ_CONFIG_FILE="$nd/rabbitmq.conf"
        RABBITMQ_ADVANCED_CONFIG_FILE="$nd/advanced.config"
        RABBITMQ_ENABLED_PLUGINS_FILE="$DIR/enabled_plugins"
        RABBITMQ_MNESIA_BASE="$nd/mnesia"
        RABBITMQ_LOG_BASE="$nd/log"
        RABBITMQ_PID_FILE="$nd/rabbit.pid"
        RABBITMQ_PLUGINS_EXPAND_DIR="$nd/plugins-expand"
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
        RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
        RABBITMQ_CTL_DIST_PORT_MIN=$((PORT_BASE + 40000))
        RABBITMQ_CTL_DIST_PORT_MAX=$((PORT_BASE + 40010))
    )
}

# ctl N ARGS...: rabbitmqctl against node N with the private cookie, bounded
# by TIMEOUT (+10 s so that its own --timeout options fire first).
ctl() {
    local n="$1"
    shift
    node_env "$n"
    (cd "$DIR" && timeout $((TIMEOUT + 10)) env -i "${NODE_ENV[@]}" \
        "$RMQ_BIN_DIR/rabbitmqctl" -n "$(node_name "$n")" "$@")
}

# node_pids N: pids of every process of node N (launcher shell, beam and its
# helpers), found by the exact RABBITMQ_MNESIA_BASE in their environment.
node_pids() {
    local want p
    want="RABBITMQ_MNESIA_BASE=$(node_dir "$1")/mnesia"
    for p in /proc/[0-9]*; do
        if tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qxF -- "$want"; then
            printf '%s\n' "${p#/proc/}"
        fi
    done
}

# beam_pid N: pid of node N's Erlang VM if it is alive and really node N's.
beam_pid() {
    local pf pid
    pf="$(node_dir "$1")/rabbit.pid"
    [[ -s "$pf" ]] || return 1
    pid="$(tr -dc 0-9 <"$pf")"
    [[ -n "$pid" ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" |
        grep -qxF -- "RABBITMQ_MNESIA_BASE=$(node_dir "$1")/mnesia" || return 1
    printf '%s\n' "$pid"
}

node_has_procs() { [[ -n "$(node_pids "$1")" ]]; }

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

show_log_tail() {
    local n="$1" nd f
    nd="$(node_dir "$n")"
    for f in "$nd/stdout.log" "$nd/log/$(node_name "$n").log"; do
        [[ -s "$f" ]] || continue
        printf -- '----- last 30 lines of %s -----\n' "$f" >&2
        tail -n 30 "$f" >&2
    done
}

# prepare_dir: DIR layout, cookie, config files (kept if they already exist).
prepare_dir() {
    local n nd
    mkdir -p "$DIR/home"
    chmod 700 "$DIR/home"
    touch "$MARKER"
    [[ -s "$SIZE_FILE" ]] || printf '%s\n' "$SIZE" >"$SIZE_FILE"
    if [[ ! -s "$COOKIE" ]]; then
        (umask 077 && od -An -tx1 -N24 /dev/urandom | tr -d ' \n' | tr a-f A-F >"$COOKIE")
        chmod 400 "$COOKIE"
    fi
    # Private env file: keeps /etc/rabbitmq/rabbitmq-env.conf out of the picture.
    [[ -f "$DIR/rabbitmq-env.conf" ]] || printf '# private, intentionally empty\n' >"$DIR/rabbitmq-env.conf"
    # No plugins: no management (15672) or other extra listeners.
    [[ -f "$DIR/enabled_plugins" ]] || printf '[].\n' >"$DIR/enabled_plugins"
    for n in "${NODES[@]}"; do
        nd="$(node_dir "$n")"
        mkdir -p "$nd/mnesia" "$nd/log"
        cat >"$nd/rabbitmq.conf" <<EOF
# generated by scripts/rabbitmq_cluster.sh for $(node_name "$n")
listeners.tcp.1 = 127.0.0.1:$(amqp_port "$n")
cluster_name = imgate-rmq-cluster
loopback_users.guest = true
log.console = false
log.file.level = info
EOF
        [[ -f "$nd/advanced.config" ]] || printf '[].\n' >"$nd/advanced.config"
    done
}

# launch N: start node N's rabbitmq-server in the background, in its own
# session, with a clean environment; returns at once.
launch() {
    local n="$1" nd p
    nd="$(node_dir "$n")"
    for p in "$(amqp_port "$n")" "$(dist_port "$n")"; do
        if port_open "$p"; then
            die "port $p (for $(node_name "$n")) is already in use by another process"
        fi
    done
    node_env "$n"
    rm -f "$nd/rabbit.pid"
    printf -- '--- %s: starting %s\n' "$(date '+%F %T')" "$(node_name "$n")" >>"$nd/stdout.log"
    (cd "$nd" && exec setsid nohup env -i "${NODE_ENV[@]}" "$RMQ_BIN_DIR/rabbitmq-server" \
        >>"$nd/stdout.log" 2>&1 </dev/null) &
    printf '%s\n' "$!" >"$nd/launcher.pid"
}

# await N: wait (bounded) until node N has fully booted.
await() {
    local n="$1" deadline=$((SECONDS + TIMEOUT))
    while ((SECONDS < deadline)); do
        if ctl "$n" -q await_startup --timeout 10 >/dev/null 2>&1; then
            return 0
        fi
        if ! node_has_procs "$n"; then
            show_log_tail "$n"
            die "$(node_name "$n") exited during startup (logs above; clean up with: $0 stop $DIR)"
        fi
        sleep 1
    done
    show_log_tail "$n"
    die "$(node_name "$n") did not finish booting within ${TIMEOUT}s (logs above; clean up with: $0 stop $DIR)"
}

# is_member N: node N's cluster already includes node 1.
is_member() {
    ctl "$1" -q cluster_status --formatter json 2>/dev/null | grep -qF "\"$(node_name 1)\""
}

join() {
    local n="$1"
    log "joining $(node_name "$n") to $(node_name 1)"
    ctl "$n" -q stop_app >/dev/null
    ctl "$n" -q join_cluster "$(node_name 1)" >/dev/null
    ctl "$n" -q start_app >/dev/null
    await "$n"
}

# stop_one N: graceful stop (bounded), then TERM/KILL whatever is left.
stop_one() {
    local n="$1" pid deadline pids
    if pid="$(beam_pid "$n")"; then
        if [[ "${HARD:-0}" == 1 && "$CMD" == stop-node ]]; then
            log "killing $(node_name "$n") (SIGKILL, pid $pid)"
            kill -KILL "$pid" 2>/dev/null || true
        else
            log "stopping $(node_name "$n") (pid $pid)"
            ctl "$n" -q stop >/dev/null 2>&1 ||
                log "  rabbitmqctl stop failed or timed out; signalling instead"
        fi
    fi
    deadline=$((SECONDS + 15))
    while pids="$(node_pids "$n")" && [[ -n "$pids" ]]; do
        if ((SECONDS >= deadline)); then
            log "  killing leftover processes of $(node_name "$n"): $(echo "$pids" | tr '\n' ' ')"
            # shellcheck disable=SC2086  # word splitting of the pid list is intended
            kill -KILL $pids 2>/dev/null || true
            sleep 1
            break
        fi
        if ((SECONDS + 10 >= deadline)); then
            # shellcheck disable=SC2086
            kill -TERM $pids 2>/dev/null || true
        fi
        sleep 1
    done
    rm -f "$(node_dir "$n")/rabbit.pid" "$(node_dir "$n")/launcher.pid"
}

print_urls() {
    local n urls=()
    for n in "${NODES[@]}"; do
        log "$(node_name "$n"): $(amqp_url "$n")"
        urls+=("$(amqp_url "$n")")
    done
    log "amqp URLs: $(IFS=,; printf '%s' "${urls[*]}")"
}

# start_nodes N...: launch the given nodes together, wait for each, then make
# sure the other nodes (2 and 3, if any) are in node 1's cluster.
start_nodes() {
    local n started=()
    for n in "$@"; do
        if beam_pid "$n" >/dev/null; then
            log "$(node_name "$n") already running"
        elif node_has_procs "$n"; then
            log "$(node_name "$n") is booting"
            started+=("$n")
        else
            log "starting $(node_name "$n") (AMQP $(amqp_port "$n"), dist $(dist_port "$n"))"
            launch "$n"
            started+=("$n")
        fi
    done
    # Wait for node 1 first: 2 and 3 can only join a running node 1.
    for n in "${NODES[@]}"; do
        if [[ " ${started[*]} " == *" $n "* ]]; then
            await "$n"
        fi
    done
    for n in "$@"; do
        if [[ "$n" != 1 ]] && ! is_member "$n"; then
            beam_pid 1 >/dev/null || die "node 1 is not running; cannot join $(node_name "$n")"
            join "$n"
        fi
    done
}

cmd_start() {
    local n all_up=1
    if [[ -f "$MARKER" ]]; then
        for n in "${NODES[@]}"; do
            if ! beam_pid "$n" >/dev/null || ! ctl "$n" -q ping >/dev/null 2>&1; then
                all_up=0
            fi
        done
        if ((all_up)); then
            log "cluster already running in $DIR"
            print_urls
            return 0
        fi
    fi
    if [[ ! -f "$MARKER" && -d "$DIR" && -n "$(ls -A "$DIR")" ]]; then
        die "$DIR exists and was not made by this script; pick an empty or new DIR"
    fi
    prepare_dir
    # All at once: fresh nodes boot standalone and join afterwards; nodes with
    # data (KEEP=1) wait for each other's Mnesia, so they must boot together.
    start_nodes "${NODES[@]}"
    log "cluster up in $DIR"
    print_urls
}

cmd_stop() {
    local n
    if [[ ! -d "$DIR" ]]; then
        log "nothing to stop: $DIR does not exist"
        return 0
    fi
    [[ -f "$MARKER" ]] || die "$DIR is not a cluster dir made by this script (no $MARKER)"
    # Reverse order: node 1 stops last, so it can boot first next time.
    for ((n = SIZE; n >= 1; n--)); do
        stop_one "$n"
    done
    if [[ "${KEEP:-0}" == 1 ]]; then
        log "stopped; kept $DIR"
    else
        rm -rf -- "$DIR"
        log "stopped; removed $DIR"
    fi
}

cmd_status() {
    local n pid up=()
    [[ -f "$MARKER" ]] || die "no cluster in $DIR (run start first)"
    for n in "${NODES[@]}"; do
        if pid="$(beam_pid "$n")"; then
            log "$(node_name "$n"): running (pid $pid) $(amqp_url "$n")"
            up+=("$n")
        else
            log "$(node_name "$n"): not running"
        fi
    done
    ((${#up[@]})) || die "no node is running"
    log ""
    ctl "${up[0]}" cluster_status
}

case "$CMD" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    urls) print_urls | tail -n 1 | sed 's/^amqp URLs: //' ;;
    stop-node)
        [[ -f "$MARKER" ]] || die "no cluster in $DIR"
        stop_one "$NODE_ARG"
        ;;
    start-node)
        [[ -f "$MARKER" ]] || die "no cluster in $DIR (run start first)"
        prepare_dir
        start_nodes "$NODE_ARG"
        log "$(node_name "$NODE_ARG"): $(amqp_url "$NODE_ARG")"
        ;;
    -h | --help | help) usage ;;
    *) usage ;;
esac
