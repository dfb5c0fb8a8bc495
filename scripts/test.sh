#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine that has only Go.
#
# The repository holds several modules: the library (.), and, each with its
# own go.mod so that the library's go.mod lists only what the library
# imports, grpcx/ and rls/ (the gRPC and Envoy adapters: grpc,
# go-control-plane), cmd/spillway-ratelimit/ (the Envoy binary), bench/,
# loadtest/ and examples/. go.work ties them together for development
# (go run ./loadtest and go build ./cmd/spillway-ratelimit from the root).
#
# With no arguments (what CI runs) it first checks every module, each on its
# own (GOWORK=off, as a user who fetches it builds it), and fails on the
# first finding:
#   go mod tidy -diff   go.mod and go.sum are tidy
#   gofmt -l            every file is formatted
#   go vet              no vet findings
#   staticcheck         no findings (pinned version, run through the Go
#                       toolchain; settings in staticcheck.conf)
# then three checks of what the repository may contain:
#   dependencies        the library's module graph (go mod graph at the root)
#                       mentions no gonum.org module, no miniredis, no
#                       github.com/prometheus/ module and no
#                       go.opentelemetry.io/otel/exporters/ module
#   admission           no code in loadtest/ decides admission itself
#                       (loadtest/admission_test.go, go/ast)
#   figures             no figure measured in README.md or docs/ is in more
#                       than one of those files: one home per figure, a
#                       generated table under docs/figures/ for what a
#                       command measures; and docs/'s prose (generated
#                       tables excluded) stays within its word budget
#                       (internal/docfigures, git ls-files)
#   api                 the exported API of the library packages is the one
#                       api/spillway.txt records (internal/apidump;
#                       regenerate with go run ./internal/apidump -w)
# then finds redis-server (and redis-cli, for the Cluster tests) or installs
# them with apt-get when running as root, and runs go test -race over every
# module's packages in one go test (the workspace: go test ./... at the
# root alone does not enter the nested modules).
#
# Extra arguments skip the checks and are passed to go test
# (e.g. ./scripts/test.sh -run Cluster ./tiers/).
#
# CHECKS_ONLY=1 ./scripts/test.sh runs the checks (every module, then the
# dependencies, admission, figures and api checks) and stops before the tests: to debug
# a CI failure in the checks without the test run.
set -euo pipefail
cd "$(dirname "$0")/.."

STATICCHECK=honnef.co/go/tools/cmd/staticcheck@v0.8.2

fail() {
  echo "test.sh: $*" >&2
  exit 1
}

# The modules, the library first (the directories go.work uses).
MODULES=(. grpcx rls cmd/spillway-ratelimit bench loadtest examples)

check_module() { # $1: module directory
  local dir=$1 out
  echo "test.sh: checking $dir (go mod tidy -diff, gofmt -l, go vet, staticcheck)" >&2
  (cd "$dir" && GOWORK=off go mod tidy -diff) || fail "$dir: go.mod/go.sum are not tidy: run go mod tidy there"
  out=$(cd "$dir" && gofmt -l .)
  [ -z "$out" ] || fail "$dir: gofmt -l lists files that are not formatted (run gofmt -w):
$out"
  (cd "$dir" && GOWORK=off go vet ./...) || fail "$dir: go vet found problems"
  (cd "$dir" && GOWORK=off go run "$STATICCHECK" ./...) || fail "$dir: staticcheck found problems"
}

# The library's go.mod lists only what the library imports: the harness's
# plots (gonum.org/v1/plot) and embedded Redis (miniredis) live in
# loadtest/go.mod, the examples' exporters and Prometheus client in
# examples/go.mod, grpc (whose go.mod requires gonum.org/v1/gonum) in
# grpcx/go.mod and rls/go.mod, go-control-plane (which requires
# prometheus/client_model) in rls/go.mod. Checked on every edge of go mod
# graph at the root (GOWORK=off: the library alone), with no exception:
# any gonum.org module, miniredis, any github.com/prometheus/ module or any
# go.opentelemetry.io/otel/exporters/ module (otel itself, its sdk and
# metric API are the library's: telemetry/) fails the check.
check_dependencies() {
  local found
  echo "test.sh: checking the library's module graph (no gonum, miniredis, Prometheus, OTel exporter module)" >&2
  found=$(GOWORK=off go mod graph | awk '
    $2 ~ /^(gonum\.org\/|github\.com\/alicebob\/miniredis|github\.com\/prometheus\/|go\.opentelemetry\.io\/otel\/exporters\/)/ {
      print "  " $1 " requires " $2
    }') || fail "go mod graph at the root failed"
  [ -z "$found" ] || fail "the library's go.mod graph (go mod graph at the root) holds modules only the harness, the examples or the gRPC/Envoy modules need; move them to their module:
$found"
}

if [ "$#" -eq 0 ]; then
  for m in "${MODULES[@]}"; do
    check_module "$m"
  done
  check_dependencies
  echo "test.sh: building cmd/spillway-ratelimit as its Dockerfile does (CGO_ENABLED=0: a static binary)" >&2
  bin=$(mktemp -d)/spillway-ratelimit
  (cd cmd/spillway-ratelimit && CGO_ENABLED=0 GOWORK=off go build -o "$bin" .) ||
    fail "cmd/spillway-ratelimit does not build with CGO_ENABLED=0 (cmd/spillway-ratelimit/Dockerfile builds it so)"
  go version -m "$bin" | grep -q 'CGO_ENABLED=0' || fail "$bin: not built with CGO_ENABLED=0"
  "$bin" -version >/dev/null || fail "$bin -version failed"
  rm -rf "$(dirname "$bin")"
  echo "test.sh: checking that loadtest/ decides no admission itself" >&2
  (cd loadtest && go test -count=1 -run 'TestNoAdmissionOutsideTheLibrary|TestAdmissionCheckFails' .) ||
    fail "loadtest/ decides admission outside the library's blocks (see loadtest/admission_test.go)"
  echo "test.sh: checking that every figure measured in README.md or docs/ has one home, and docs/'s word budget" >&2
  go test -count=1 -run 'TestFigures|TestDocsWordBudget' ./internal/docfigures/ ||
    fail "a figure measured in README.md or docs/ is in more than one of those files (keep it in its generated table under docs/figures/ and link there), or docs/ is over its word budget (see internal/docfigures)"
  echo "test.sh: checking that the exported API is the one api/spillway.txt records" >&2
  go run ./internal/apidump ||
    fail "the exported API differs from api/spillway.txt: if the change is meant, run go run ./internal/apidump -w and commit the file with it"
  if [ "${CHECKS_ONLY:-}" = 1 ]; then
    echo "test.sh: CHECKS_ONLY=1: the checks passed; no tests run" >&2
    exit 0
  fi
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
  for m in "${MODULES[@]:1}"; do
    set -- "$@" "./$m/..."
  done
fi
exec go test -race -timeout 12m "$@"
