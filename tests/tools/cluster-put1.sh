#!/usr/bin/env bash
# One client's sequential puts (etcd's `benchmark put`, 256-byte values) on a fresh
# three-member cluster of a server build, sent to the leader or to a follower (compare-etcd.sh's
# put1 spreads them over the three members): puts/s, and the members' CPU (user+sys) and
# context switches per put, summed over the three and for each member's threads by name, and
# each member's user and system time per put.
# For A/B comparisons of two builds, run alternately on a quiet machine. Given the no-op
# server (target/release/examples/noop-kv), it measures the floor: three no-op members, written
# through the leader.
# Usage:  [N=puts] cluster-put1.sh path/to/server leader|follower
# Needs: go (tests/tools/etcd-tools.sh builds etcdctl and benchmark once), python3.
set -euo pipefail
exe=$(readlink -f "${1:?usage: cluster-put1.sh path/to/server leader|follower}")
to=${2:?usage: cluster-put1.sh path/to/server leader|follower}
n=${N:-3000}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/etcd-tools.sh" --with-benchmark)
d=$(mktemp -d)
pids=()
trap 'set +e; kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$d"' EXIT
. "$here/three-members.sh"
if [ "$(basename "$exe")" = noop-kv ]; then
  # The floor: three no-op members (examples/noop-kv), m0 leading; raft's messages and
  # fsyncs for each write, nothing else.
  [ "$to" = leader ] || { echo "the no-op cluster is written through its leader only" >&2; exit 2; }
  for i in 1 2; do
    NOOP_PEER_LISTEN=127.0.0.1:$((23800 + i)) "$exe" >>"$d/m$i.log" 2>&1 &
    pids[i]=$!
  done
  NOOP_FSYNC=1 NOOP_CLIENT=127.0.0.1:23790 NOOP_PEERS=127.0.0.1:23801,127.0.0.1:23802 \
    "$exe" >>"$d/m0.log" 2>&1 &
  pids[0]=$!
  took_write 127.0.0.1:23790 foo || { echo "the no-op cluster took no write" >&2; exit 1; }
  leader=23790
else
  start_cluster foo
  leader=$(leader_endpoint "$eps")
  leader=${leader##*:}
fi
[ -n "$leader" ] || { echo "no leader" >&2; exit 1; }
port=$leader
[ "$to" = follower ] && port=$((23790 + (leader - 23790 + 1) % 3))
# member, thread name, thread id, voluntary and involuntary switches, user and system ticks;
# then each member's ticks as its process counts them (with threads that ended meanwhile)
threads() {
  local i t
  for i in 0 1 2; do
    for t in /proc/"${pids[$i]}"/task/*; do
      echo "m$i $(tr ' ' _ <"$t/comm") ${t##*/} $(awk '/^voluntary_ctxt/{v=$2} /^nonvoluntary/{n=$2} END{print v, n}' "$t/status") $(awk '{print $14, $15}' "$t/stat")"
    done
    echo "m$i process - 0 0 $(awk '{print $14, $15}' /proc/"${pids[$i]}"/stat)"
  done
}
threads >"$d/before"
out=$("$bin/benchmark" --endpoints "127.0.0.1:$port" --conns 1 --clients 1 put --key-size 8 \
  --sequential-keys --val-size 256 --total "$n" 2>&1 | tr '\r' '\n')
threads >"$d/after"
echo "leader 127.0.0.1:$leader, client to 127.0.0.1:$port: $(printf '%s\n' "$out" | awk '/Requests\/sec:/{print $2}') puts/s"
# Each thread's share: what it did since before, all of it if it started meanwhile (a peer
# stream's reading thread may); the members' user and system time from their processes.
awk -v n="$n" -v hz="$(getconf CLK_TCK)" '
  NR == FNR { b[$1 " " $3] = $4 " " $5 " " $6 " " $7; next }
  {
    split(($1 " " $3) in b ? b[$1 " " $3] : "0 0 0 0", o, " ")
    if ($2 == "process") {
      mu[$1] = ($6 - o[3]) / hz * 1e6 / n; ms[$1] = ($7 - o[4]) / hz * 1e6 / n; next
    }
    k = $1 " " $2; cs[k] += ($4 - o[1] + $5 - o[2]) / n; us[k] += ($6 - o[3] + $7 - o[4]) / hz * 1e6 / n
  }
  END {
    for (k in cs) if (cs[k] >= 0.05 || us[k] >= 1) printf "  %-24s %6.2f switches %7.1f us per put\n", k, cs[k], us[k]
    for (m in mu) { printf "  %-2s user %5.1f us, system %5.1f us per put\n", m, mu[m], ms[m]; tu += mu[m] + ms[m] }
    for (k in cs) tc += cs[k]
    printf "total %.1f context switches, %.0f us of CPU per put\n", tc, tu
  }' "$d/before" "$d/after" | sort
