#!/usr/bin/env bash
# The secrets of docker-compose.yml (and docker-compose.cluster.yml), one file
# each in deploy/secrets/ (git- and docker-ignored): random values from
# openssl, hex (safe inside URLs and config files). A file already there is
# kept, so this is safe to rerun; delete a file to make it anew (and see
# docs/deploy.md, "Rotating a secret": some are only read at a first start).
#
#   bash scripts/gen_secrets.sh [DIR]    # default DIR: deploy/secrets
#
# The directory is 0700 (only you on this host); the files are 0644 because
# the containers read them as their own non-root users (Compose mounts a
# file secret as it is on the host).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

DIR="${1:-deploy/secrets}"
mkdir -p "$DIR"
chmod 0700 "$DIR"

make_secret() {  # NAME COMMAND...: writes DIR/NAME from COMMAND's output unless present
    local name="$1" file="$DIR/$1"
    shift
    if [[ -s "$file" ]]; then
        echo "gen_secrets: $file kept"
        return
    fi
    (umask 022 && printf '%s' "$("$@")" >"$file.tmp" && mv "$file.tmp" "$file")
    chmod 0644 "$file"
    echo "gen_secrets: $file written"
}

hex() { openssl rand -hex "$1"; }
keyfile() { openssl rand -base64 756 | tr -d '\n'; }  # MongoDB: 6..1024 base64 characters

make_secret im_auth_secret hex 32           # HS256 token secret (IM_AUTH_SECRET, >= 32 bytes)
make_secret im_api_keys hex 24              # the server API's key (IM_API_KEYS; comma-separate more)
make_secret redis_password hex 32
make_secret rabbitmq_password hex 32
make_secret rabbitmq_erlang_cookie hex 32   # docker-compose.cluster.yml's RabbitMQ nodes
make_secret mongo_root_password hex 32      # MongoDB's admin (root) user
make_secret mongo_app_password hex 32       # the gateway's MongoDB user (readWrite on its database)
make_secret mongo_keyfile keyfile           # replica set members authenticate with it
make_secret grafana_admin_password hex 16   # the monitoring profile's Grafana (user admin)
