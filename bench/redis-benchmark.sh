#!/usr/bin/env bash
# Compares spillway's token-bucket script (lua/ratelimit_token_bucket.lua)
# with the reference HMGET/HMSET token-bucket script of issue 2 under
# redis-benchmark, on one redis-server that this script starts on a free
# loopback port (and stops), in the same run, rounds interleaved.
#
# Every call is admitted by both scripts (capacities far above the calls per
# key), so both take their write path each time; each command first runs
# once unmeasured so that both work on existing keys. spillway's policy is
# 1 per hour with a burst of 1e6, so its keys (whose TTL is the time until
# the bucket is full again) live through the run, as the reference's do
# (TTL capacity/rate + 1 s = 1000 s).
#
# Three figures per script: requests/s as redis-benchmark sees them; the
# server's wall time per call (INFO commandstats usec_per_call); and the
# server process's CPU time per request (INFO cpu used_cpu_user + sys over
# the run, networking included), which a loaded machine disturbs least: it
# is the throughput one core could sustain. The ratios are per round; the
# summary is their median.
#
# Usage: bench/redis-benchmark.sh [requests per run (default 1000000)] [rounds (default 3)]
#   EXTRA=1 also runs the script reading Redis TIME, a 1000/s policy whose
#   keys expire within milliseconds, and the batch script with one item.
# Needs redis-server, redis-cli and redis-benchmark (apt-get install redis-server redis-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}
ROUNDS=${2:-3}
KEYSPACE=100000

for b in redis-server redis-cli redis-benchmark python3; do
  command -v "$b" >/dev/null || { echo "redis-benchmark.sh: $b is required" >&2; exit 1; }
done

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize no --logfile "$dir/redis.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
cli() { redis-cli -p "$port" "$@"; }

ref='local d=redis.call("HMGET",KEYS[1],"tokens","ts") local c=tonumber(ARGV[1]) local r=tonumber(ARGV[2]) local now=tonumber(ARGV[3]) local t=tonumber(d[1]) or c local ts=tonumber(d[2]) or now t=math.min(c,t+math.max(0,now-ts)/1000*r) local a=0 if t>=1 then t=t-1 a=1 end redis.call("HMSET",KEYS[1],"tokens",t,"ts",now) redis.call("PEXPIRE",KEYS[1],math.ceil(c/r*1000)+1000) return {a,t}'
ref_sha=$(cli SCRIPT LOAD "$ref")
# the scripts as lua/ratelimit.go assembles them: the hold helpers first
tb_sha=$(cli SCRIPT LOAD "$(cat lua/ratelimit_holds.lua lua/ratelimit_token_bucket.lua)")
batch_sha=$(cli SCRIPT LOAD "$(cat lua/ratelimit_holds.lua lua/ratelimit_subwindows.lua lua/ratelimit_batch.lua)")

now_ms=1764687600000
now_us=${now_ms}000
hour_us=3600000000
cmd_of() {
  case $1 in
    # capacity 1e6 tokens, 1000 tokens/s, now in ms
    reference) echo EVALSHA "$ref_sha" 1 "ref:{__rand_int__}" 1000000 1000 "$now_ms" ;;
    # now µs, T = 1 h, tau = 1e6·T, cost 1
    token_bucket) echo EVALSHA "$tb_sha" 1 "spillway:rl:{__rand_int__}" "$now_us" "$hour_us" "${hour_us}000000" 1 ;;
    # the same, the script reading Redis TIME (ARGV[1] empty)
    token_bucket_TIME) echo EVALSHA "$tb_sha" 1 "spillway:rlt:{__rand_int__}" '""' "$hour_us" "${hour_us}000000" 1 ;;
    # 1000/s, burst 1e6: a key is full again (and expires) ms after its last call
    token_bucket_1000ps) echo EVALSHA "$tb_sha" 1 "spillway:rlk:{__rand_int__}" "$now_us" 1000 1000000000 1 ;;
    # the batch script, one token-bucket item (alg, L, P µs, B, T, n, uid)
    batch_1_item) echo EVALSHA "$batch_sha" 1 "spillway:rlb:{__rand_int__}" "$now_us" 0 1 "$hour_us" 1000000 "$hour_us" 1 '""' ;;
  esac
}
bench() { # requests/s of one run
  eval "redis-benchmark -p $port -P 16 -c 50 -n $N -r $KEYSPACE --csv $(cmd_of "$1")" | tail -1 | cut -d, -f2 | tr -d '"'
}
usec_per_call() { cli INFO commandstats | grep '^cmdstat_evalsha' | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/'; }
cpu_seconds() { cli INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}'; }

names=(reference token_bucket)
if [ "${EXTRA:-0}" = 1 ]; then names+=(token_bucket_TIME token_bucket_1000ps batch_1_item); fi
for name in "${names[@]}"; do bench "$name" >/dev/null; done # warm up: create the keys

echo "redis-benchmark -P 16 -c 50 -n $N -r $KEYSPACE; redis $(redis-server --version | cut -d' ' -f3 | cut -d= -f2); $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg); $ROUNDS rounds"
declare -A rps us cpu
rr="" ru="" rc=""
for r in $(seq "$ROUNDS"); do
  for name in "${names[@]}"; do
    cli CONFIG RESETSTAT >/dev/null
    c0=$(cpu_seconds)
    v=$(bench "$name")
    c1=$(cpu_seconds)
    u=$(usec_per_call)
    c=$(python3 -c "print(($c1 - $c0) * 1e6 / $N)")
    rps[$name]="${rps[$name]:-} $v"
    us[$name]="${us[$name]:-} $u"
    cpu[$name]="${cpu[$name]:-} $c"
    printf 'round %d  %-20s %10.0f req/s  %7.2f µs/call wall  %6.2f µs/req CPU\n' "$r" "$name" "$v" "$u" "$c"
  done
  rr="$rr $(python3 -c "print(round(${rps[token_bucket]##* }/${rps[reference]##* }, 2))")"
  ru="$ru $(python3 -c "print(round(${us[reference]##* }/${us[token_bucket]##* }, 2))")"
  rc="$rc $(python3 -c "print(round(${cpu[reference]##* }/${cpu[token_bucket]##* }, 2))")"
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "medians:"
for name in "${names[@]}"; do
  printf '  %-20s %10.0f req/s  %7.2f µs/call wall  %6.2f µs/req CPU\n' "$name" "$(echo "${rps[$name]}" | median)" "$(echo "${us[$name]}" | median)" "$(echo "${cpu[$name]}" | median)"
done
echo "token_bucket vs reference, throughput ratio per round:${rr}; median $(echo "$rr" | median)x (target >= 1.5x)"
echo "token_bucket vs reference, server wall time ratio per round:${ru}; median $(echo "$ru" | median)x"
echo "token_bucket vs reference, server CPU ratio per round:${rc}; median $(echo "$rc" | median)x (the throughput ratio on an idle core)"
