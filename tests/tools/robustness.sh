#!/usr/bin/env bash
# The robustness suite's long profile: for each cluster size, RUNS runs of DURATION each on a
# fresh cluster of the given binary (kvd, or with ETCD=1 etcd v3.6.5 too, for comparison),
# randomized traffic from many clients — etcd's and Kubernetes' profiles, runs alternating —
# while faults are injected one at a time (SIGKILL and restart, SIGSTOP, partitions and
# one-way loss between members, clients cut, leadership transfer, compaction and
# defragmentation, a member replaced, and with a kvd built with `--features failpoints` a
# crash at a failpoint), every run's histories checked (tests/clients/go/robustness:
# porcupine, the watch guarantees, lease expiry, the members' final state and alarms).
# Every run prints its seed; `-seed` of tests/clients/go/cmd/robustness replays one.
# Usage:  robustness.sh path/to/kvd
#   MEMBERS (default "1 3 5"), RUNS (default 4), DURATION (default 5m), SEED, ETCD (0/1),
#   FAULTS (default all), PROFILE (etcd, kubernetes, default both),
#   LOG (default robustness-<date>.log)
# Prints one TOTAL line per binary and cluster size; exits 1 if any run found a violation.
set -euo pipefail
kvd=$(readlink -f "${1:?usage: robustness.sh path/to/kvd}")
here=$(cd "$(dirname "$0")" && pwd)
members=${MEMBERS:-1 3 5}
runs=${RUNS:-4}
duration=${DURATION:-5m}
seed=${SEED:-$(( $(date +%s) % 100000 * 10 ))}
faults=${FAULTS:-all}
profile=${PROFILE:-both}
log=${LOG:-robustness-$(date +%Y%m%d-%H%M).log}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$here/../clients/go" && GOFLAGS=-mod=mod go build -o "$work/robustness" ./cmd/robustness)
bins=("$kvd")
if [ "${ETCD:-0}" = 1 ]; then
  bins+=("$("$here/etcd-tools.sh")/etcd")
fi
status=0
for bin in "${bins[@]}"; do
  for n in $members; do
    "$work/robustness" -bin "$bin" -members "$n" -runs "$runs" -duration "$duration" \
      -seed "$seed" -faults "$faults" -profile "$profile" 2>>"$log.stderr" | tee -a "$log" | grep -E '^(run|TOTAL|  VIOLATION)' || status=1
    seed=$((seed + runs))
  done
done
echo "full output in $log (the clients' own logging in $log.stderr)"
grep '^TOTAL' "$log" | tail -n $(( ${#bins[@]} * $(wc -w <<<"$members") ))
exit $status
