#!/usr/bin/env bash
# Installs Debian's `docker-compose` (1.29.2 on bookworm), the checker CI runs on
# compose/docker-compose.yml (`docker-compose -f compose/docker-compose.yml config`). No Docker
# engine is needed for that. Exits 0 at once when `docker-compose` is already on PATH; otherwise
# needs apt-get and root or passwordless sudo, and says so (exit 1) when it has neither.
set -euo pipefail

if command -v docker-compose >/dev/null 2>&1; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_compose_checker: docker-compose is missing and there is no apt-get;" \
        "install docker-compose 1.29+ by hand" >&2
    exit 1
fi

if [[ $(id -u) -eq 0 ]]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    echo "install_compose_checker: docker-compose is missing and installing it needs root" \
        "(or passwordless sudo): apt-get install docker-compose" >&2
    exit 1
fi

"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
command -v docker-compose >/dev/null
