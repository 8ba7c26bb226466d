#!/usr/bin/env bash
# One workload of etcd's `benchmark` tool against one fresh single-member server, printing its
# throughput and the server process's own CPU per request (user+sys, then each: the split is
# the kernel's tick sampling, the sum exact): for A/B comparisons of two kvd builds (or kvd and
# etcd), run alternately, one server at a time. With THREADS=1 it
# also prints the load generator's CPU and, for each of the server's threads, its CPU time and
# context switches (voluntary, involuntary) per request: where a server's time goes.
# mixed-s and mixed-l time one client's serializable or linearizable reads while 10 other
# clients put as fast as they can, and print the reads' latency (the CPU then includes the puts).
# Usage:  [THREADS=1] [N=requests] server-cpu.sh path/to/server put1|put100|range-l|range-s|mixed-s|mixed-l
# Needs: go (tests/tools/etcd-tools.sh builds etcdctl and benchmark once).
set -euo pipefail
exe=$(readlink -f "${1:?usage: server-cpu.sh path/to/server workload}")
wl=${2:?usage: server-cpu.sh path/to/server workload}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/etcd-tools.sh" --with-benchmark)
d=$(mktemp -d)
"$exe" --name bench --data-dir "$d/data" \
  --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
  --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
  --initial-cluster bench=http://127.0.0.1:23800 >"$d/log" 2>&1 &
pid=$!
puts=
trap 'set +e; kill $puts $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$d"' EXIT
for _ in $(seq 100); do
  "$bin/etcdctl" --endpoints 127.0.0.1:23790 put foo bar >/dev/null 2>&1 && break
  sleep 0.1
done
B="$bin/benchmark --endpoints 127.0.0.1:23790"
# the server's user and system ticks
ticks() { awk '{print $14, $15}' "/proc/$pid/stat"; }
# thread id, name, ticks, voluntary and involuntary switches
threads() {
  for t in /proc/$pid/task/*; do
    echo "$(basename "$t") $(tr ' ' _ <"$t/comm") $(awk '{print $14+$15}' "$t/stat") \
      $(awk '/^voluntary_ctxt/{v=$2} /nonvoluntary_ctxt/{n=$2} END{print v, n}' "$t/status")"
  done | sort
}
timed() { /usr/bin/time -f "client cpu %U s user %S s sys" "$@"; }
[ -n "${THREADS:-}" ] && threads >"$d/a"
read -r u0 s0 <<<"$(ticks)"
case $wl in
  put1)    n=${N:-3000};  out=$(timed $B --conns 1 --clients 1 put --key-size 8 --sequential-keys --val-size 256 --total "$n" 2>&1) ;;
  put100)  n=${N:-60000}; out=$(timed $B --conns 10 --clients 100 put --key-size 8 --sequential-keys --val-size 256 --total "$n" 2>&1) ;;
  range-l) n=${N:-60000}; out=$(timed $B --conns 10 --clients 100 range foo --consistency l --total "$n" 2>&1) ;;
  range-s) n=${N:-60000}; out=$(timed $B --conns 10 --clients 100 range foo --consistency s --total "$n" 2>&1) ;;
  mixed-s|mixed-l)
    n=${N:-4000}
    $B --conns 10 --clients 10 put --key-size 8 --sequential-keys --val-size 256 --total 10000000 >/dev/null 2>&1 &
    puts=$!
    sleep 1
    out=$(timed $B --conns 1 --clients 1 range foo --consistency "${wl#mixed-}" --total "$n" 2>&1)
    kill $puts; wait $puts 2>/dev/null || true; puts= ;;
  *) echo "unknown workload $wl" >&2; exit 2 ;;
esac
read -r u1 s1 <<<"$(ticks)"
rps=$(echo "$out" | tr '\r' '\n' | awk '/Requests\/sec/{print $2}')
hz=$(getconf CLK_TCK)
echo "$(basename "$exe") $wl req/s=$rps $(awk -v u="$((u1 - u0))" -v s="$((s1 - s0))" -v n="$n" \
  -v hz="$hz" 'BEGIN{f = 1e6 / hz / n
    printf "cpu-us/req=%.1f user-us/req=%.1f sys-us/req=%.1f", (u + s) * f, u * f, s * f}')"
case $wl in mixed-*) echo "$out" | tr '\r' '\n' | awk '/Average:/{a=$2} /99% in/{p=$3} /99.9% in/{q=$3}
  END{printf "reads: average %.2f ms, p99 %.2f ms, p99.9 %.2f ms\n", a*1000, p*1000, q*1000}' ;; esac
[ -z "${THREADS:-}" ] && exit 0
threads >"$d/b"
echo "$out" | grep 'client cpu'
join "$d/a" "$d/b" | awk -v n="$n" -v hz="$hz" '{
  cpu = ($7 - $3) * 1e6 / hz / n; v = ($8 - $4) / n; nv = ($9 - $5) / n
  if (cpu > 0 || v > 0.01) printf "%-20s cpu/req=%7.1fus vcs/req=%5.2f ivcs/req=%5.2f\n", $2, cpu, v, nv
  T += cpu; V += v; N += nv
} END { printf "%-20s cpu/req=%7.1fus vcs/req=%5.2f ivcs/req=%5.2f\n", "TOTAL", T, V, N }'
