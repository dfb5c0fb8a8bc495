#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine that has only Go:
# finds redis-server (and redis-cli, for the Cluster tests) or installs them
# with apt-get when running as root, then runs go test -race ./...
# Extra arguments are passed to go test (e.g. ./scripts/test.sh -run Cluster ./tiers/).
set -euo pipefail
cd "$(dirname "$0")/.."

need_install=0
command -v redis-server >/dev/null 2>&1 || need_install=1
command -v redis-cli >/dev/null 2>&1 || need_install=1
if [ "$need_install" = 1 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing redis-server and redis-tools with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq redis-server redis-tools >/dev/null
  else
    echo "test.sh: redis-server and redis-cli are required; install them (e.g. apt-get install redis-server redis-tools) and rerun" >&2
    exit 1
  fi
fi
echo "test.sh: using $(redis-server --version | head -1)" >&2

if [ "$#" -eq 0 ]; then
  set -- ./...
fi
exec go test -race -timeout 12m "$@"
