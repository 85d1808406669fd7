#!/usr/bin/env bash
# The test suite, twice: against the single Redis (IM_REDIS_URL, default the
# local 6379), then against a private local 3-master Redis Cluster
# (scripts/redis_cluster.sh, ports 7001-7003), started here and stopped at the
# end; then the JavaScript SDK's tests (clients/js, Node against real nodes it
# starts itself). Extra arguments go to both pytest runs. The demo's browser
# test runs inside pytest (tests/integration/gateway/test_demo_browser.py).
# Run after scripts/setup.sh.
#   bash scripts/test.sh            # everything (what CI runs)
#   PASSES=single bash scripts/test.sh   # some passes: single | cluster | js
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PASSES="${PASSES:-single cluster js}"

for pass in $PASSES; do
    case "$pass" in
    single)
        echo "== pytest: single Redis"
        .venv/bin/python -m pytest -q "$@"
        ;;
    cluster)
        echo "== pytest: Redis Cluster (3 masters)"
        seeds="$(bash scripts/redis_cluster.sh start | sed -n 's/^seeds: //p')"
        trap 'bash scripts/redis_cluster.sh stop >/dev/null' EXIT
        IM_REDIS_CLUSTER=1 IM_REDIS_URL="$seeds" .venv/bin/python -m pytest -q "$@"
        ;;
    js)
        echo "== clients/js: npm test"
        (cd clients/js && npm test --silent)
        ;;
    *)
        echo "test.sh: unknown pass '$pass' (single | cluster | js)" >&2
        exit 2
        ;;
    esac
done
