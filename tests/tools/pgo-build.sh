#!/usr/bin/env bash
# Builds kvd (or the no-op server) with profile-guided optimization, and prints the binary's
# path. Three steps: a build that counts what its code does (`-Cprofile-generate`); a training
# run of that build under etcd's `benchmark` — the workloads of compare-etcd.sh (put1, put100,
# range-l, range-s, txn-put, watch; in the clear and over mutual TLS with auth on; one member
# and three), reads and puts through the leasing proxy (compare-proxy.sh), a restart from
# 300,000 keys (memory-per-key.sh) — whose counts llvm-profdata merges; and the build again
# with those counts (`-Cprofile-use`): hot paths laid out together and inlined, cold ones moved
# out of their way. Beside the kernel's, a put's CPU is mostly its code and data coming back
# into caches the kernel left cold (docs/measurements.md), so the layout is what counts. Code
# the training never ran is built as cold: compaction, defragmentation, snapshots and
# membership changes are not in it.
# The no-op (`noop-kv`, the floor kvd's put1 is measured against) trains on what it serves:
# put1 on one member and through a three-member cluster's leader.
# Usage:  [PROFILE=release|image] pgo-build.sh [kvd|noop-kv]
#   Builds in target/pgo/ (two builds of their own, a few minutes each; the training about as
#   long), leaving target/release alone, and copies the binary to target/pgo/<profile>/.
# Needs: go (tests/tools/etcd-tools.sh builds etcdctl and benchmark once), openssl, python3,
# and llvm-profdata from rustup's llvm-tools component (added here when missing).
set -euo pipefail
what=${1:-kvd}
case $what in kvd | noop-kv) ;; *) echo "usage: pgo-build.sh [kvd|noop-kv]" >&2; exit 2 ;; esac
profile=${PROFILE:-release}
root=$(cd "$(dirname "$0")/../.." && pwd)
tools=$root/tests/tools
host=$(rustc -vV | awk '/^host:/{print $2}')
profdata=$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata
if [ ! -x "$profdata" ]; then
  rustup component add llvm-tools >&2 || true
  [ -x "$profdata" ] || { echo "pgo-build.sh: no llvm-profdata at $profdata" >&2; exit 2; }
fi
work=$root/target/pgo
raw=$work/raw-$what-$profile
rm -rf "$raw"
mkdir -p "$raw" "$work/$profile"

# What cargo builds, and where the binary lands under a target directory.
which=(--bin kvd) binary=kvd
[ "$what" = noop-kv ] && which=(--example noop-kv) binary=examples/noop-kv

# cargo build with extra rustflags into a target directory of its own. With --target, cargo
# gives RUSTFLAGS to the program only, not to build scripts and procedural macros.
build() { # rustflags target-dir
  (cd "$root" && RUSTFLAGS="${RUSTFLAGS:-} $1" cargo build -q --profile "$profile" -p kvd \
    "${which[@]}" --target "$host" --target-dir "$2") >&2
}

echo "pgo-build.sh: building $what to count ($profile)" >&2
build "-Cprofile-generate=$raw" "$work/gen"
gen=$work/gen/$host/$profile/$binary

echo "pgo-build.sh: training" >&2
log=$work/train-$what-$profile.log
: >"$log"
# One step of the training, its output in the log; a step that fails stops the build.
train() {
  "$@" >>"$log" 2>&1 || { echo "pgo-build.sh: training failed at: $* (see $log)" >&2; exit 1; }
}
# Every process of the counting build writes its counts at exit (kvd exits on SIGTERM, as the
# scripts stop it).
export LLVM_PROFILE_FILE=$raw/$what-%p.profraw
if [ "$what" = kvd ]; then
  for members in 1 3; do
    MEMBERS=$members SCALE=${PGO_SCALE:-0.3} MODES="plain tls-auth" AGAINST=$gen \
      train "$tools/compare-etcd.sh" "$gen" put1 put100 range-l range-s txn-put watch
  done
  DELAYS=0 TARGETS="kvd-proxy direct" SECS=2 train "$tools/compare-proxy.sh" "$gen"
  # A restart: the WAL replayed and the index rebuilt from 300,000 keys.
  train "$tools/memory-per-key.sh" "$gen" 300000
else
  NOOP_FSYNC=1 N=10000 train "$tools/server-cpu.sh" "$gen" put1
  N=3000 train "$tools/cluster-put1.sh" "$gen" leader
fi
unset LLVM_PROFILE_FILE
if ! ls "$raw"/*.profraw >/dev/null 2>&1; then
  echo "pgo-build.sh: the training left no counts (see $log)" >&2
  exit 1
fi
"$profdata" merge -o "$work/$what-$profile.profdata" "$raw"/*.profraw >&2

echo "pgo-build.sh: building $what with the counts" >&2
build "-Cprofile-use=$work/$what-$profile.profdata" "$work/use"
cp "$work/use/$host/$profile/$binary" "$work/$profile/$what"
echo "$work/$profile/$what"
