#!/usr/bin/env bash
# A Kubernetes-shaped watch workload against kvd and etcd v3.6.5, taking turns on a fresh
# single-member server each: thousands of watchers on a few prefixes, each on a Watch stream
# of its own, while writers put 1 KiB objects at a steady rate (tests/clients/go/cmd/kwatch).
# Every watcher's events are checked against the writes (each once, in order, none missed or
# invented); a run with a bad watcher fails. Prints, per server: the puts' achieved rate,
# events delivered, delivery latency from a put's send to a watcher's receipt (p50, p99,
# max), the puts' own p99, and the server's CPU time (user+sys) per delivered event.
# Usage:  k8s-watch.sh path/to/kvd [rate ...]
#   WATCHERS (default 2000), PREFIXES (4), DURATION (20s), RUNS (1: rounds over the rates),
#   AGAINST=path/to/other-kvd takes etcd's place (an A/B of two builds)
# Needs: go (builds kwatch; tests/tools/etcd-tools.sh builds etcd and etcdctl once).
set -euo pipefail
kvd=$(readlink -f "${1:?usage: k8s-watch.sh path/to/kvd [rate ...]}"); shift
rates=${*:-500}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/etcd-tools.sh")
against=$(readlink -f "${AGAINST:-$bin/etcd}")
work=$(mktemp -d)
pid=
cleanup() { set +e; [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
(cd "$here/../clients/go" && go build -o "$work/kwatch" ./cmd/kwatch)
ep=127.0.0.1:23790

start() {
  "$1" --name kw --data-dir "$work/data" --quota-backend-bytes $((8 << 30)) \
    --listen-client-urls "http://$ep" --advertise-client-urls "http://$ep" \
    --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster kw=http://127.0.0.1:23800 >"$work/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 150); do
    "$bin/etcdctl" --endpoints "$ep" --dial-timeout 500ms put __ready__ 1 >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "$1 did not start; its log:" >&2
  tail -20 "$work/server.log" >&2
  exit 1
}
stop() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; rm -rf "$work/data"; }
hz=$(getconf CLK_TCK)
ticks() { awk '{print $14+$15}' "/proc/$pid/stat"; }

run() { # server rate -> one line
  local t0 t1 out
  start "$1"
  t0=$(ticks)
  if ! out=$("$work/kwatch" -endpoints "$ep" -watchers "${WATCHERS:-2000}" \
    -prefixes "${PREFIXES:-4}" -rate "$2" -duration "${DURATION:-20s}" 2>"$work/kwatch.err"); then
    echo "$(basename "$1"): kwatch failed:" >&2
    tail -20 "$work/kwatch.err" >&2
    exit 1
  fi
  t1=$(ticks)
  stop
  printf '%s\n' "$out" | awk -v name="$(basename "$1")" -v rate="$2" -v cpu="$(( t1 - t0 ))" -v hz="$hz" '
    { for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2]; if ($i ~ /^latency-ms/) l = i; if ($i ~ /^put-ms/) p = i } }
    END {
      split($(l+1), a, "="); split($(l+3), b, "="); split($(l+5), c, "="); split($(p+2), d, "=")
      printf "%-6s %6s | %8s %10s %10s %4s | %8s %8s %8s | %8s | %7.2f\n", name, rate, f["put-rate"],
        f["events-expected"], f["delivered"], f["bad-watchers"], a[2], b[2], c[2], d[2],
        cpu / hz * 1e6 / (f["delivered"] > 0 ? f["delivered"] : 1)
    }'
}

printf '%-6s %6s | %8s %10s %10s %4s | %8s %8s %8s | %8s | %7s\n' server rate put/s events delivered bad \
  p50-ms p99-ms max-ms put-p99 cpu-us/ev
for _ in $(seq "${RUNS:-1}"); do
  for r in $rates; do
    run "$against" "$r"
    run "$kvd" "$r"
  done
done
