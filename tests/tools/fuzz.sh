#!/usr/bin/env bash
# Runs kvd's fuzz targets (fuzz/fuzz_targets/) with cargo fuzz (libFuzzer), each for a time,
# from the corpora in fuzz/corpus/ (seeded by `cargo run -p kvd-fuzz --bin seeds`), and then
# minimizes each corpus (cargo fuzz cmin) so that what is kept in the repository stays small.
# A crash stops that target and leaves its input in fuzz/artifacts/<target>/; turn it into a
# regression test next to the code it broke.
# Usage:  tests/tools/fuzz.sh [seconds-per-target] [target...]   (default: 1800 s, all targets)
#   JOBS=n    targets run n at a time (default 1; each uses one core)
#   NOCMIN=1  keep the corpora as the runs left them
# Needs: the nightly toolchain and cargo-fuzz (cargo install --locked cargo-fuzz).
# Temporary files go to TMPDIR, /dev/shm by default: the targets create databases and WAL
# segments per input, and fsync on tmpfs costs nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
secs=${1:-1800}
shift || true
if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
jobs=${JOBS:-1}
export TMPDIR=${TMPDIR:-/dev/shm}
logs=$here/target/fuzz-logs
mkdir -p "$logs"

cargo run -q -p kvd-fuzz --bin seeds
cargo +nightly fuzz build

run() {
  local t=$1
  # -timeout: one input taking 30 s is a hang, which is a finding too.
  if cargo +nightly fuzz run "$t" -- -max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 \
    -print_final_stats=1 >"$logs/$t.log" 2>&1; then
    echo "$t: clean for ${secs}s: $(grep -E '^stat::number_of_executed_units' "$logs/$t.log" | awk '{print $2}') runs, $(grep -cE '^#[0-9]+.*(NEW|REDUCE)' "$logs/$t.log") corpus additions"
  else
    echo "$t: FAILED, see $logs/$t.log and fuzz/artifacts/$t/"
    return 1
  fi
}

failed=0
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
  run "$t" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done

if [ -z "${NOCMIN:-}" ]; then
  for t in "${targets[@]}"; do
    cargo +nightly fuzz cmin "$t" >>"$logs/$t.log" 2>&1
    echo "$t: corpus $(find "fuzz/corpus/$t" -type f | wc -l) files, $(du -sh "fuzz/corpus/$t" | cut -f1)"
  done
fi
exit "$failed"
