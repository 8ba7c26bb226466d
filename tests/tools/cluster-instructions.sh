#!/usr/bin/env bash
# Instructions executed per replicated put by one member of a fresh three-member cluster, counted
# by valgrind's callgrind: the member runs under it (member 2; made the leader with `leader`, a
# follower with `follower`, alone in a cluster of one with `one`), one client puts N 256-byte
# values through the leader at RATE puts/s (slow enough for the member under callgrind to keep
# up). Counts are near-deterministic, unlike CPU
# time on a noisy machine: for A/B comparisons of two builds' per-write code paths. Left out:
# the store's background flush thread (its cost per put depends on the rate: a flush every
# 100 ms takes what came since). At this rate each put's commit index goes out on its own
# (`Config::commit_tell_delay` passes before the next put), which a busy leader piggybacks.
# Prints the total, each thread's share, and leaves the per-thread profiles in OUT (default a
# temporary directory, removed) for `callgrind_annotate --inclusive=yes FILE`. Given the no-op
# server (target/release/examples/noop-kv), it counts the floor's: three no-op members, as
# `cluster-put1.sh` starts them, or one alone (`one`, as `server-cpu.sh` runs it).
# With CACHE=1 callgrind also simulates caches far smaller than the machine's (16 KiB for code,
# 16 KiB for data, 32 KiB behind them) and prints the last level's misses per put: roughly the
# code and data lines a put touches, the footprint a put brings back into caches that the
# kernel's work between its syscalls (an fsync, a wait for the client) left cold.
# The flush thread is told apart by its function's name: a build without symbols (the image
# profile strips them) has it counted in, with a warning.
# Usage:  [N=puts] [RATE=puts/s] [OUT=dir] [CACHE=1] cluster-instructions.sh path/to/server \
#         leader|follower|one
# Needs: valgrind (apt-get install valgrind), go (etcd-tools.sh builds etcdctl and benchmark).
set -euo pipefail
exe=$(readlink -f "${1:?usage: cluster-instructions.sh path/to/kvd leader|follower|one}")
role=${2:?usage: cluster-instructions.sh path/to/kvd leader|follower|one}
n=${N:-1000}
rate=${RATE:-50}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/etcd-tools.sh" --with-benchmark)
d=$(mktemp -d)
out=${OUT:-$d/profiles}
mkdir -p "$out"
pids=()
trap 'set +e; kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$d"' EXIT
. "$here/three-members.sh"
cache=()
[ -n "${CACHE:-}" ] && cache=(--cache-sim=yes --I1=16384,4,64 --D1=16384,4,64 --LL=32768,4,64)
grind() { # the member under callgrind: its command line
  valgrind --tool=callgrind --separate-threads=yes "${cache[@]}" \
    --callgrind-out-file="$out/callgrind.%p" "$@" >>"$d/m2.log" 2>&1 &
  pids[2]=$!
}
if [ "$(basename "$exe")" = noop-kv ]; then
  # The floor: three no-op members (examples/noop-kv, as cluster-put1.sh starts them), the
  # one under callgrind a follower or the leader; or one alone.
  case "$role" in
    leader | follower | one) ;;
    *) echo "a no-op member is a leader, a follower or one alone" >&2; exit 2 ;;
  esac
  c=127.0.0.1:23790 f=127.0.0.1:23801,127.0.0.1:23802
  if [ "$role" != one ]; then
    NOOP_PEER_LISTEN=127.0.0.1:23801 "$exe" >>"$d/m1.log" 2>&1 &
    pids[1]=$!
  fi
  case "$role" in
    one) NOOP_FSYNC=1 NOOP_CLIENT=$c grind "$exe" ;;
    follower)
      NOOP_PEER_LISTEN=127.0.0.1:23802 grind "$exe"
      sleep 3 # its listener up under callgrind before the leader dials it
      NOOP_FSYNC=1 NOOP_CLIENT=$c NOOP_PEERS=$f "$exe" >>"$d/m0.log" 2>&1 &
      pids[0]=$! ;;
    leader)
      NOOP_PEER_LISTEN=127.0.0.1:23802 "$exe" >>"$d/m0.log" 2>&1 &
      pids[0]=$!
      NOOP_FSYNC=1 NOOP_CLIENT=$c NOOP_PEERS=$f grind "$exe" ;;
  esac
  took_write 127.0.0.1:23790 foo || { echo "the no-op cluster took no write" >&2; exit 1; }
  leader=127.0.0.1:23790
else
  if [ "$role" = one ]; then
    cluster=m2=http://127.0.0.1:23802 eps=127.0.0.1:23792
  else
    start_member 0
    start_member 1
  fi
  c=http://127.0.0.1:23792 p=http://127.0.0.1:23802
  grind "$exe" --name m2 --data-dir "$d/m2" --listen-client-urls "$c" --advertise-client-urls "$c" \
    --listen-peer-urls "$p" --initial-advertise-peer-urls "$p" --initial-cluster "$cluster"
  [ "$role" = one ] && first=127.0.0.1:23792 || first=127.0.0.1:23790,127.0.0.1:23791
  took_write "$first" foo || { echo "the cluster took no write" >&2; exit 1; }
  status() { "$bin/etcdctl" --endpoints "$1" endpoint status -w json; }
  # Wait for member 2 to catch up (it starts slowly under callgrind).
  for _ in $(seq 300); do
    status 127.0.0.1:23792 >/dev/null 2>&1 && break
    sleep 0.2
  done
  if [ "$role" = leader ]; then
    id=$(status 127.0.0.1:23792 | python3 -c '
import json, sys
print("%x" % json.load(sys.stdin)[0]["Status"]["header"]["member_id"])')
    "$bin/etcdctl" --endpoints "$eps" move-leader "$id" >/dev/null
    sleep 5
  fi
  leader=$(leader_endpoint "$eps")
  case "$role:$leader" in
    leader:127.0.0.1:23792 | one:127.0.0.1:23792 | follower:127.0.0.1:2379[01]) ;;
    *) echo "member 2 is not the $role (the leader is $leader)" >&2; exit 1 ;;
  esac
fi
put() { # N puts, given ten times as long as the rate asks (and a minute more) to finish
  timeout $(($1 * 10 / rate + 60)) "$bin/benchmark" --endpoints "$leader" --conns 1 \
    --clients 1 put --key-size 8 --sequential-keys --val-size 256 --total "$1" \
    --rate "$rate" >/dev/null 2>&1 || { echo "the benchmark's $1 puts failed or hung" >&2; exit 1; }
}
put 300 # warm up: connections, the store's first pages
sleep 3
callgrind_control -z "${pids[2]}" >/dev/null 2>&1
put "$n"
sleep 2
callgrind_control -d "${pids[2]}" >/dev/null 2>&1
sleep 2
dumps=("$out"/callgrind.*.1-*)
if [ ! -e "${dumps[0]}" ]; then
  echo "callgrind wrote no dump for the member; the end of its log:" >&2
  tail -5 "$d/m2.log" >&2
  exit 1
fi
counted="all threads but the flush"
if ! grep -q -m1 '::' "${dumps[@]}"; then
  echo "the build has no symbols: its flush thread cannot be told apart and is counted in" >&2
  counted="all threads, the flush's among them"
fi
echo "$(basename "$exe") member under callgrind as $role, $n puts at $rate/s through $leader:"
for f in "${dumps[@]}"; do
  # Ir, and with CACHE=1 the last level's code misses and data misses (reads and writes)
  read -r t lc ld < <(awk '/^summary:/{print $2, $8 + 0, $9 + $10; exit}' "$f")
  name=$(grep -m1 -o 'flush_loop' "$f" || true)
  echo "$t ${name:-other} $f $lc $ld"
done | awk -v n="$n" -v cache="${CACHE:-}" -v counted="$counted" '
  $2 == "flush_loop" { printf "  %-44s %8d per put (left out)\n", "the flush thread", $1 / n; next }
  $1 > 0 {
    s += $1; lc += $4; ld += $5; t = $3; sub(/.*-/, "thread ", t)
    if ($1 / n >= 100) printf "  %-44s %8d per put\n", t, $1 / n
  }
  END {
    printf "instructions per put, %s: %d\n", counted, s / n
    if (cache)
      printf "lines missed per put in the small caches: %d of code, %d of data\n", lc / n, ld / n
  }'
