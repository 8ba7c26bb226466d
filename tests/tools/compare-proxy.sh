#!/usr/bin/env bash
# kvd's leasing proxy against etcd v3.6.5's leasing proxy and against the cluster itself, in
# one run on this machine. One single-member cluster (kvd by default; CLUSTER=etcd for etcd)
# sits behind a delaying TCP proxy (tests/clients/go/cmd/delayproxy: DELAYS, each way); both
# leasing proxies (kvd grpc-proxy start, etcd grpc-proxy start; each its own leasing prefix)
# and the "direct" clients reach the cluster through it. For each delay and target it prints
# requests/s, p50 and p99 latency (ms) and the proxy process's CPU time per request (user +
# sys; the cluster's for "direct"). Each delay gets fresh proxies with leasing prefixes of
# their own:
#   range1      etcd's `benchmark range k --consistency l`, 100 clients on 10 connections
#   range1-lat  the same with one client: the latency of one read at a time
#   range1000   linearizable reads of random keys among 1,000 (kvload; etcd's benchmark reads
#               one key or one range only), 100 clients
#   miss-mixed  10 clients, 90 % linearizable reads and 10 % puts of 1,000 keys attached to a
#               lease (kvload -leased; fresh keys for each target): a leasing proxy must never
#               hold such a key, so every read through a proxy is a cache miss; compare its
#               read latency with direct's
# Targets: kvd-proxy, etcd-proxy, direct, and tcp-hop (a plain TCP forwarder in front of the
# same delayed link: what any extra hop costs on this machine, the floor under a miss).
# Usage:  compare-proxy.sh path/to/kvd [workload ...]
#   DELAYS="0 5ms 20ms" (default), TARGETS="kvd-proxy etcd-proxy direct", SECS=5 per run.
# Needs: go (tests/tools/etcd-tools.sh builds etcd, etcdctl and benchmark once).
set -euo pipefail
kvd=$(readlink -f "${1:?usage: compare-proxy.sh path/to/kvd [workload ...]}"); shift
workloads=${*:-range1 range1-lat range1000 miss-mixed}
delays=${DELAYS:-0 5ms 20ms}
targets=${TARGETS:-kvd-proxy etcd-proxy direct tcp-hop}
secs=${SECS:-5}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/etcd-tools.sh" --with-benchmark)
gomod=$here/../clients/go
tools=${KVD_TOOLS_DIR:-$HOME/.cache/kvd-tools}/proxy-bench
mkdir -p "$tools"
(cd "$gomod" && GOFLAGS=-mod=mod go build -o "$tools/delayproxy" ./cmd/delayproxy \
  && GOFLAGS=-mod=mod go build -o "$tools/kvload" ./cmd/kvload)
work=$(mktemp -d)
pids=()
cleanup() { set +e; for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$work"; }
trap cleanup EXIT

member=127.0.0.1:24379 delayed=127.0.0.1:24380 hop=127.0.0.1:24383 kvdp=127.0.0.1:24390 etcdp=127.0.0.1:24391
cluster=$kvd
[ "${CLUSTER:-kvd}" = etcd ] && cluster=$bin/etcd
"$cluster" --name bench --data-dir "$work/data" \
  --listen-client-urls "http://$member" --advertise-client-urls "http://$member" \
  --listen-peer-urls http://127.0.0.1:24381 --initial-advertise-peer-urls http://127.0.0.1:24381 \
  --initial-cluster bench=http://127.0.0.1:24381 >"$work/cluster.log" 2>&1 &
cluster_pid=$!
pids+=("$cluster_pid")
ready() { # endpoint: waits until a linearizable read through it succeeds
  for _ in $(seq 200); do
    "$bin/etcdctl" --endpoints "$1" --dial-timeout 500ms --command-timeout 2s get __ready__ >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "$1 did not answer" >&2; tail -20 "$work"/*.log >&2; exit 1
}
ready "$member"
"$bin/etcdctl" --endpoints "$member" put k v >/dev/null

hz=$(getconf CLK_TCK)
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }

run() { # workload endpoint pid target -> "rps p50 p99 cpu-us"
  local w=$1 ep=$2 pid=$3 t=$4 fresh="mm-$4-$delay/" out t0 t1 n rps p50 p99
  local B="$bin/benchmark --endpoints $ep"
  # Warm up: the proxies take the keys they are read.
  case $w in
    range1|range1-lat) $B --conns 1 --clients 1 range k --consistency l --total 20 >/dev/null 2>&1 ;;
    range1000) "$tools/kvload" -endpoint "$ep" -keys 1000 -clients 10 -conns 10 -duration 2s >/dev/null ;;
    miss-mixed) "$tools/kvload" -endpoint "$ep" -prefix "$fresh" -keys 1000 -leased -clients 10 -conns 10 -duration 1s >/dev/null ;;
  esac
  sleep 0.5
  t0=$(ticks "$pid")
  case $w in
    range1|range1-lat)
      local c=100 total
      [ "$w" = range1-lat ] && c=1
      # About SECS seconds of requests: a proxy answers from its cache whatever the delay; the
      # cluster itself, one round trip over the delayed link per client at a time.
      local direct=1
      case $t in kvd-proxy|etcd-proxy) direct=0 ;; esac
      total=$(awk -v s="$secs" -v c="$c" -v d="$delay_ms" -v direct="$direct" 'BEGIN{
        r = (c>1) ? 20000 : 5000
        if (direct && d>0) { r = c*1000/(2*d+0.5); if (r>20000) r=20000 }
        t=int(r*s); if (t<200) t=200; print t}')
      out=$($B --conns "$(( c < 10 ? c : 10 ))" --clients "$c" range k --consistency l --total "$total" 2>&1 | tr '\r' '\n')
      n=$(printf '%s\n' "$out" | awk '/Total:/{t=$2} /Requests\/sec:/{r=$2} END{printf "%d", t*r}')
      rps=$(printf '%s\n' "$out" | awk '/Requests\/sec:/{v=$2} END{print v+0}')
      p50=$(printf '%s\n' "$out" | awk '/50% in/{v=$3} END{printf "%.3f", v*1000}')
      p99=$(printf '%s\n' "$out" | awk '/99% in/{v=$3} END{printf "%.3f", v*1000}')
      ;;
    range1000|miss-mixed)
      local args=(-endpoint "$ep" -keys 1000 -duration "${secs}s" -prefill=false)
      if [ "$w" = range1000 ]; then args+=(-clients 100 -conns 10); else args+=(-prefix "$fresh" -clients 10 -conns 10 -writes 0.1 -leased); fi
      out=$("$tools/kvload" "${args[@]}")
      local reads; reads=$(printf '%s\n' "$out" | grep '^reads')
      n=$(printf '%s\n' "$out" | awk '{for(i=1;i<=NF;i++) if ($i ~ /^count=/) {split($i,a,"="); s+=a[2]}} END{print s+0}')
      rps=$(printf '%s\n' "$reads" | sed 's/.*rps=\([^ ]*\).*/\1/')
      p50=$(printf '%s\n' "$reads" | sed 's/.*p50=\([^ ]*\).*/\1/')
      p99=$(printf '%s\n' "$reads" | sed 's/.*p99=\([^ ]*\).*/\1/')
      ;;
    *) echo "unknown workload $w" >&2; exit 2 ;;
  esac
  t1=$(ticks "$pid")
  awk -v r="$rps" -v a="$p50" -v b="$p99" -v t0="$t0" -v t1="$t1" -v hz="$hz" -v n="$n" \
    'BEGIN{ printf "%.0f %s %s %.1f\n", r, a, b, (n>0) ? (t1-t0)/hz*1e6/n : 0 }'
}

printf '%-6s %-11s %-10s | %9s %8s %8s %8s\n' delay workload target rps p50-ms p99-ms cpu-us
for delay in $delays; do
  delay_ms=$(awk -v d="$delay" 'BEGIN{ if (d ~ /ms$/) {sub(/ms$/,"",d); print d+0} else if (d ~ /s$/) {sub(/s$/,"",d); print d*1000} else print d+0 }')
  "$tools/delayproxy" -listen "$delayed" -to "$member" -delay "${delay_ms}ms" >"$work/delay.log" 2>&1 &
  dpid=$!
  "$tools/delayproxy" -listen "$hop" -to "$delayed" >"$work/hop.log" 2>&1 &
  hpid=$!
  pids+=("$hpid")
  "$kvd" grpc-proxy start --endpoints "$delayed" --listen-addr "$kvdp" \
    --experimental-leasing-prefix "_kvd$delay/" --log-format text --log-level "${PROXY_LOG:-warn}" >"$work/kvd-proxy.log" 2>&1 &
  kpid=$!
  "$bin/etcd" grpc-proxy start --endpoints "$delayed" --listen-addr "$etcdp" \
    --experimental-leasing-prefix "_etcd$delay/" >"$work/etcd-proxy.log" 2>&1 &
  epid=$!
  pids+=("$dpid" "$kpid" "$epid")
  ready "$delayed"; ready "$hop"; ready "$kvdp"; ready "$etcdp"
  for w in $workloads; do
    for t in $targets; do
      case $t in
        kvd-proxy) ep=$kvdp pid=$kpid ;;
        etcd-proxy) ep=$etcdp pid=$epid ;;
        direct) ep=$delayed pid=$cluster_pid ;;
        tcp-hop) ep=$hop pid=$hpid ;;
        *) echo "unknown target $t" >&2; exit 2 ;;
      esac
      read -r rps p50 p99 cpu < <(run "$w" "$ep" "$pid" "$t")
      printf '%-6s %-11s %-10s | %9s %8s %8s %8s\n' "$delay" "$w" "$t" "$rps" "$p50" "$p99" "$cpu"
      [ -n "${SHOW_METRICS:-}" ] && [ "$t" = kvd-proxy ] && curl -s "http://$kvdp/metrics" | grep -E '^(etcd_grpc_proxy_cache|kvd_leasing)' >&2
    done
  done
  # The proxies first, while they can still give their keys back through the delay proxy.
  kill "$kpid" "$epid" 2>/dev/null || true
  wait "$kpid" "$epid" 2>/dev/null || true
  kill "$dpid" "$hpid" 2>/dev/null || true
  wait "$dpid" "$hpid" 2>/dev/null || true
done
