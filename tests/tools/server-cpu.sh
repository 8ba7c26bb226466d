#!/usr/bin/env bash
# One workload of etcd's `benchmark` tool against one fresh single-member server, printing its
# throughput and the server process's own CPU (user+sys) per request: for A/B comparisons of
# two kvd builds (or kvd and etcd), run alternately, one server at a time.
# Usage:  server-cpu.sh path/to/server put1|put100|range-l|range-s
# Needs: ../shared/tools/etcd-peers.sh (builds etcdctl and benchmark once).
set -euo pipefail
exe=$(readlink -f "${1:?usage: server-cpu.sh path/to/server workload}")
wl=${2:?usage: server-cpu.sh path/to/server workload}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/../../../shared/tools/etcd-peers.sh")
d=$(mktemp -d)
"$exe" --name bench --data-dir "$d/data" \
  --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
  --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
  --initial-cluster bench=http://127.0.0.1:23800 >"$d/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$d"' EXIT
for _ in $(seq 100); do
  "$bin/etcdctl" --endpoints 127.0.0.1:23790 put foo bar >/dev/null 2>&1 && break
  sleep 0.1
done
B="$bin/benchmark --endpoints 127.0.0.1:23790"
ticks() { awk '{print $14+$15}' "/proc/$pid/stat"; }
t0=$(ticks)
case $wl in
  put1)    n=3000;  out=$($B --conns 1 --clients 1 put --key-size 8 --sequential-keys --val-size 256 --total $n 2>&1) ;;
  put100)  n=60000; out=$($B --conns 10 --clients 100 put --key-size 8 --sequential-keys --val-size 256 --total $n 2>&1) ;;
  range-l) n=60000; out=$($B --conns 10 --clients 100 range foo --consistency l --total $n 2>&1) ;;
  range-s) n=60000; out=$($B --conns 10 --clients 100 range foo --consistency s --total $n 2>&1) ;;
  *) echo "unknown workload $wl" >&2; exit 2 ;;
esac
t1=$(ticks)
rps=$(echo "$out" | awk '/Requests\/sec/{print $2}')
hz=$(getconf CLK_TCK)
echo "$(basename "$exe") $wl req/s=$rps cpu-us/req=$(awk -v a="$t0" -v b="$t1" -v n="$n" -v hz="$hz" 'BEGIN{printf "%.1f", (b-a)*1e6/hz/n}')"
