#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine that has only Go.
#
# With no arguments (what CI runs) it first checks both modules (the main one
# and bench/) and fails on the first finding:
#   go mod tidy -diff   go.mod and go.sum are tidy
#   gofmt -l            every file is formatted
#   go vet              no vet findings
#   staticcheck         no findings (pinned version, run through the Go
#                       toolchain; settings in staticcheck.conf)
# then finds redis-server (and redis-cli, for the Cluster tests) or installs
# them with apt-get when running as root, and runs go test -race ./...
#
# Extra arguments skip the checks and are passed to go test
# (e.g. ./scripts/test.sh -run Cluster ./tiers/).
set -euo pipefail
cd "$(dirname "$0")/.."

STATICCHECK=honnef.co/go/tools/cmd/staticcheck@v0.8.2

fail() {
  echo "test.sh: $*" >&2
  exit 1
}

check_module() { # $1: module directory
  local dir=$1 out
  echo "test.sh: checking $dir (go mod tidy -diff, gofmt -l, go vet, staticcheck)" >&2
  (cd "$dir" && go mod tidy -diff) || fail "$dir: go.mod/go.sum are not tidy: run go mod tidy there"
  out=$(cd "$dir" && gofmt -l .)
  [ -z "$out" ] || fail "$dir: gofmt -l lists files that are not formatted (run gofmt -w):
$out"
  (cd "$dir" && go vet ./...) || fail "$dir: go vet found problems"
  (cd "$dir" && go run "$STATICCHECK" ./...) || fail "$dir: staticcheck found problems"
}

if [ "$#" -eq 0 ]; then
  check_module .
  check_module bench
fi

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
    fail "redis-server and redis-cli are required; install them (e.g. apt-get install redis-server redis-tools) and rerun"
  fi
fi
echo "test.sh: using $(redis-server --version | head -1)" >&2

if [ "$#" -eq 0 ]; then
  set -- ./...
fi
exec go test -race -timeout 12m "$@"
