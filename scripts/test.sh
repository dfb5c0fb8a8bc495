#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine that has only Go.
#
# The repository holds several modules: the library (.), and, each with its
# own go.mod so that the library's go.mod lists only what the library
# imports, bench/, loadtest/ and examples/ (when present). go.work ties
# them together for development (go run ./loadtest from the root).
#
# With no arguments (what CI runs) it first checks every module, each on its
# own (GOWORK=off, as a user who fetches it builds it), and fails on the
# first finding:
#   go mod tidy -diff   go.mod and go.sum are tidy
#   gofmt -l            every file is formatted
#   go vet              no vet findings
#   staticcheck         no findings (pinned version, run through the Go
#                       toolchain; settings in staticcheck.conf)
# then two checks of what the modules may contain:
#   dependencies        the library's module graph (go mod graph at the root)
#                       holds no plotting, embedded-Redis, Prometheus client
#                       or OpenTelemetry exporter module
#   admission           no code in loadtest/ decides admission itself
#                       (loadtest/admission_test.go, go/ast)
# then finds redis-server (and redis-cli, for the Cluster tests) or installs
# them with apt-get when running as root, and runs go test -race over every
# module's packages in one go test (the workspace: go test ./... at the
# root alone does not enter the nested modules).
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

# The modules, the library first; examples/ once it has its own go.mod.
MODULES=(. bench loadtest)
[ -f examples/go.mod ] && MODULES+=(examples)

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
# loadtest/go.mod, the examples' exporters in examples/go.mod. Checked on
# the edges of go mod graph at the root (GOWORK=off: the library alone):
#   - go.opentelemetry.io/otel itself is the library's (telemetry/); its
#     exporters are not;
#   - github.com/prometheus/client_model is allowed: go-control-plane (the
#     rls server's Envoy API) brings it, a data model of metric protos, not
#     a Prometheus client or exporter;
#   - gonum.org/v1/gonum is allowed only as a requirement of
#     google.golang.org/grpc's own go.mod (for grpc's tests): the library
#     cannot drop it without dropping grpc, and nothing of it is compiled
#     into the library.
check_dependencies() {
  local found
  echo "test.sh: checking the library's module graph (no gonum, miniredis, Prometheus client, OTel exporters)" >&2
  found=$(GOWORK=off go mod graph | awk '
    $2 ~ /^(gonum\.org\/|github\.com\/alicebob\/miniredis|github\.com\/prometheus\/(client_golang|common)@|go\.opentelemetry\.io\/otel\/exporters\/)/ {
      if ($2 ~ /^gonum\.org\/v1\/gonum@/ && $1 ~ /^google\.golang\.org\/grpc@/) next
      print "  " $1 " requires " $2
    }')
  [ -z "$found" ] || fail "the library's go.mod graph (go mod graph at the root) holds modules only the harness or the examples need; move them to their module:
$found"
}

if [ "$#" -eq 0 ]; then
  for m in "${MODULES[@]}"; do
    check_module "$m"
  done
  check_dependencies
  echo "test.sh: checking that loadtest/ decides no admission itself" >&2
  (cd loadtest && go test -count=1 -run 'TestNoAdmissionOutsideTheLibrary|TestAdmissionCheckFails' .) ||
    fail "loadtest/ decides admission outside the library's blocks (see loadtest/admission_test.go)"
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
