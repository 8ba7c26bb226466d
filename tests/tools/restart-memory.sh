#!/usr/bin/env bash
# The memory a member takes while it restarts: a three-member cluster holding a few keys, one
# member killed (SIGKILL) and started again, ROUNDS times; prints the restarted member's peak
# resident memory (VmHWM: until it answers a read and 3 s more) and what it settles at.
# Issue 19 saw a kvd member restarted this way reach 0.3–1.3 GB for a few seconds.
# Run it for kvd and for etcd (`$(tests/tools/etcd-tools.sh)/etcd`), one at a time.
# Usage:  restart-memory.sh path/to/server [ROUNDS, default 3]
# Needs: go (tests/tools/etcd-tools.sh builds etcdctl and etcd once).
set -euo pipefail
exe=$(readlink -f "${1:?usage: restart-memory.sh path/to/server [rounds]}")
rounds=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/etcd-tools.sh")
d=$(mktemp -d)
pids=(0 0 0)
trap 'set +e; for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$d"' EXIT
. "$here/three-members.sh"
ctl() { "$bin/etcdctl" --dial-timeout 500ms --command-timeout 2s "$@"; }
start_cluster k0
for k in 1 2 3 4; do ctl --endpoints "$eps" put "k$k" v >/dev/null; done
kib() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
for r in $(seq "$rounds"); do
  sleep 2
  kill -9 "${pids[1]}"
  wait "${pids[1]}" 2>/dev/null || true
  start_member 1
  p=${pids[1]} t0=$(date +%s.%N) caught=
  # Serving: it answers a serializable read of the last key from its own store.
  for _ in $(seq 300); do
    if ctl --endpoints http://127.0.0.1:23791 get k4 --consistency=s 2>/dev/null | grep -q k4; then
      caught=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}')
      break
    fi
    sleep 0.05
  done
  sleep 3
  printf 'round %d: answering in %s s; peak %d MiB (anonymous now %d MiB), resident now %d MiB\n' \
    "$r" "${caught:-(never)}" $(($(kib "$p" VmHWM) / 1024)) $(($(kib "$p" RssAnon) / 1024)) \
    $(($(kib "$p" VmRSS) / 1024))
done
