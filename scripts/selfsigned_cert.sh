#!/usr/bin/env bash
# A self-signed certificate for the edge, for local use only: writes
# deploy/tls/fullchain.pem and deploy/tls/privkey.pem (git- and docker-ignored),
# which docker-compose.yml mounts into nginx as /etc/nginx/tls. For real users
# put a certificate from a CA there instead, under the same two names (the
# full chain, and its key): docs/deploy.md, "TLS".
#
#   bash scripts/selfsigned_cert.sh [NAME...]   # names besides localhost and 127.0.0.1
#   FORCE=1 bash scripts/selfsigned_cert.sh     # replace an existing pair
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

DIR="${TLS_DIR:-deploy/tls}"
DAYS="${DAYS:-365}"
if [[ -s "$DIR/fullchain.pem" && -s "$DIR/privkey.pem" && "${FORCE:-0}" != 1 ]]; then
    echo "selfsigned_cert: $DIR/fullchain.pem exists (FORCE=1 replaces it)"
    exit 0
fi
mkdir -p "$DIR"

san="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
    if [[ "$name" =~ ^[0-9.]+$ ]]; then san+=",IP:$name"; else san+=",DNS:$name"; fi
done

(
    umask 077
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -sha256 \
        -days "$DAYS" -subj "/CN=${1:-localhost}" -addext "subjectAltName=$san" \
        -keyout "$DIR/privkey.pem" -out "$DIR/fullchain.pem" 2>/dev/null
)
chmod 0644 "$DIR/fullchain.pem"
echo "selfsigned_cert: $DIR/fullchain.pem and privkey.pem for $san (valid $DAYS days)"
