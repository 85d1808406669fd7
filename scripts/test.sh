#!/usr/bin/env bash
# The tests, in passes (run after scripts/setup.sh; what CI runs):
#   single   the pytest suite against the single Redis (IM_REDIS_URL, default
#            the local 6379), but for tests/integration/gateway ...
#   gateway  ... which runs as a pass of its own at the same time (the two
#            together are the whole suite: one pass alone took 10 minutes).
#   cluster  only the tests marked `redis_topology` (tests/conftest.py marks
#            every test that reaches the run's Redis, directly or through a
#            node; tests of pure code, of the deploy files, or with a Redis of
#            their own are left out: `pytest --collect-only -q -m
#            redis_topology` lists them) against a private local 3-master
#            Redis Cluster (scripts/redis_cluster.sh, on free ports with its own
#            data dir), started for the pass and stopped after it. Tests
#            marked edge_only (fixed-seed fuzzers of the edge, the demo in a
#            browser) run only in the single Redis passes.
#   js       the JavaScript SDK's tests (clients/js: Node against real nodes it
#            starts itself).
# The demo's browser test runs inside pytest (tests/integration/gateway/test_demo_browser.py).
#
# The passes run at the same time (they share nothing but the local Redis and
# RabbitMQ: each pytest pass has a SecantusDB of its own (with_own_mongo, below),
# each pytest run has its own namespace, and every port a test uses is a free
# one), each line of output prefixed with its pass's name; PARALLEL=0 runs them
# one after the other, unprefixed. Every pass runs to its end whatever the
# others do; then one summary line per pass (name, exit status, seconds), and
# the exit status is 1 if any pass failed (pytest's 5, "no tests collected",
# included). Extra arguments go to both pytest passes.
#   bash scripts/test.sh                  # every pass (what CI runs)
#   PASSES="single gateway" bash scripts/test.sh   # some passes: single | gateway | cluster | js
#   PASSES="cluster js" PARALLEL=0 bash scripts/test.sh -x
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PASSES="${PASSES:-single gateway cluster js}"
PARALLEL="${PARALLEL:-1}"

for pass in $PASSES; do
    case "$pass" in
    single | gateway | cluster | js) ;;
    *)
        echo "test.sh: unknown pass '$pass' (single | gateway | cluster | js)" >&2
        exit 2
        ;;
    esac
done

# with_own_mongo CMD...: CMD with a SecantusDB of the pass's own as IM_MONGO_URL
# (scripts/services.sh on a free port, a fresh data dir; stopped and removed
# after), unless the caller set IM_MONGO_URL. SecantusDB answers one command
# at a time: shared by three passes on two cores, its queue grew past the
# nodes' 2 s store timeout now and then, and a test failed on an
# `unavailable` it was not about. A subshell: its EXIT trap stops the server.
OWN_MONGO_DIR=""
own_mongo() {
    [[ -z "${IM_MONGO_URL:-}" ]] || return 0
    local port
    port="$(.venv/bin/python -c 'from testkit.servers import free_port; print(free_port())')" || return
    OWN_MONGO_DIR="$(mktemp -d /tmp/imgate-test-mongo.XXXXXX)" || return
    MONGO_PORT="$port" IM_MONGO_DATA="$OWN_MONGO_DIR/data" \
        IM_STARTED_FILE="$OWN_MONGO_DIR/started" bash scripts/services.sh mongo || return
    export IM_MONGO_URL="mongodb://127.0.0.1:$port"
}

stop_own_mongo() {
    [[ -n "$OWN_MONGO_DIR" ]] || return 0
    bash scripts/services.sh stop "$OWN_MONGO_DIR/started" >/dev/null
    rm -rf "$OWN_MONGO_DIR"
}

with_own_mongo() (
    trap stop_own_mongo EXIT
    trap 'exit 130' INT TERM
    own_mongo || exit
    "$@"
)

# --durations: the slowest tests of each pass, so the next one to make faster is named.
run_single() {
    with_own_mongo .venv/bin/python -m pytest -q --durations=10 \
        --ignore=tests/integration/gateway "$@"
}

run_gateway() {
    with_own_mongo .venv/bin/python -m pytest -q --durations=10 tests/integration/gateway "$@"
}

run_cluster() (  # a subshell: its own EXIT trap stops the cluster
    # Free ports (3 masters and their cluster bus ports) and a data dir of this
    # run: a cluster someone else runs (a benchmark's on 7001-7003, another
    # test run's) is never reused nor stopped.
    base="$(.venv/bin/python -c \
        'from testkit.clusters import free_redis_cluster_port_base as f; print(f())')" || exit
    dir="$(mktemp -d /tmp/imgate-test-redis-cluster.XXXXXX)" || exit
    export REDIS_CLUSTER_PORT_BASE="$base"
    trap 'stop_own_mongo; bash scripts/redis_cluster.sh stop "$dir" >/dev/null 2>&1 || true' EXIT
    trap 'exit 130' INT TERM
    own_mongo || exit
    out="$(bash scripts/redis_cluster.sh start "$dir")" || exit
    seeds="$(sed -n 's/^seeds: //p' <<<"$out")"
    # The script waits for the first master's cluster_state:ok; the others may
    # answer CLUSTERDOWN a moment longer.
    for port in $((base + 1)) $((base + 2)) $((base + 3)); do
        for ((i = 0; ; i++)); do
            redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' && break
            ((i < 300)) || { echo "redis cluster: port $port not ok after 30s" >&2; exit 1; }
            sleep 0.1
        done
    done
    echo "redis cluster: $seeds"
    IM_REDIS_CLUSTER=1 IM_REDIS_URL="$seeds" .venv/bin/python -m pytest -q --durations=10 \
        -m redis_topology "$@"
)

run_js() {
    (cd clients/js && npm test --silent)
}

title() {
    case "$1" in
    single) echo "== pytest: single Redis, all but tests/integration/gateway" ;;
    gateway) echo "== pytest: single Redis, tests/integration/gateway" ;;
    cluster) echo "== pytest: Redis Cluster (3 masters), the tests marked redis_topology" ;;
    js) echo "== clients/js: npm test" ;;
    esac
}

# run_pass PASS ARGS...: the pass, then "STATUS SECONDS" in $results/PASS.
results="$(mktemp -d)"
trap 'rm -rf "$results"' EXIT
run_pass() {
    local pass="$1" started=$SECONDS rc
    shift
    title "$pass"
    "run_$pass" "$@"
    rc=$?
    echo "$rc $((SECONDS - started))" >"$results/$pass"
    return "$rc"
}

if [[ "$PARALLEL" == 0 ]]; then
    for pass in $PASSES; do
        run_pass "$pass" "$@"
    done
else
    export PYTHONUNBUFFERED=1  # lines as they come, through the prefixing pipe
    pids=()
    for pass in $PASSES; do
        run_pass "$pass" "$@" 2>&1 | sed -u "s/^/[$pass] /" &
        pids+=("$!")
    done
    wait "${pids[@]}"
fi

echo "== summary"
failed=0
for pass in $PASSES; do
    read -r rc seconds <"$results/$pass" 2>/dev/null || { rc="?"; seconds="?"; }
    printf '%-8s exit %-3s %6ss\n' "$pass" "$rc" "$seconds"
    [[ "$rc" == 0 ]] || failed=1
done
exit "$failed"
