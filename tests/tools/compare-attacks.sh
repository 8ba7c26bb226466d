#!/usr/bin/env bash
# The HTTP/2 attack battery (tests/clients/go/cmd/h2abuse) against a fresh one-member kvd and a
# fresh one-member etcd v3.6.5, one server at a time: for each attack, what it added to the
# server's resident memory at its peak and kept 5 s after, how a grpc-go client putting and
# reading beside it fared (calls answered, failed, the slowest), and how the server ended the
# attacker's connection. Prints a markdown table.
# Usage:  tests/tools/compare-attacks.sh path/to/kvd [seconds-per-attack]   (default 6)
#   ATTACKS="streams range-noread ..."  (default: all)
# Needs: go (tests/tools/etcd-tools.sh builds etcd once).
set -euo pipefail
kvd=$(readlink -f "${1:?usage: compare-attacks.sh path/to/kvd [seconds]}")
secs=${2:-6}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/etcd-tools.sh")
d=$(mktemp -d)
pid=
trap 'set +e; kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$d"' EXIT
(cd "$here/../clients/go" && GOFLAGS=-mod=mod go build -o "$d/h2abuse" ./cmd/h2abuse)
attacks=${ATTACKS:-streams range-noread tiny-window empty-data empty-continuation empty-fields rapid-reset reset-paired reset-reconnect ping settings header-list}

# start <name> <binary>: a fresh one-member server on 127.0.0.1:23790.
start() {
  rm -rf "$d/data"
  "$2" --name bench --data-dir "$d/data" \
    --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
    --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster bench=http://127.0.0.1:23800 >"$d/$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    "$bin/etcdctl" --endpoints 127.0.0.1:23790 put warm up >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "$1 did not start" >&2
  exit 1
}

# stop: SIGTERM, and SIGKILL after 10 s (etcd busy with gigabytes of unsent answers does not
# finish its graceful stop in any time worth waiting for).
stop() {
  kill "$pid"
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=
}

echo "| attack | server | peak MiB (+) | after 5 s (+) | probe ok / failed | slowest call | connection ended |"
echo "|---|---|---|---|---|---|---|"
for a in $attacks; do
  for s in etcd kvd; do
    if [ $s = kvd ]; then start kvd "$kvd"; else start etcd "$bin/etcd"; fi
    out=$("$d/h2abuse" -endpoint 127.0.0.1:23790 -pid "$pid" -attack "$a" -duration "${secs}s" -settle 5s)
    stop
    python3 - "$a" "$s" "$out" <<'EOF'
import json, sys
a, s, r = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
before = r["rss_before_mib"]
ended = r["goaway"] and f'{r["goaway"]} "{r["goaway_debug"]}"' or "no"
if r["goaway"] == "closed":
    ended = "closed (no GOAWAY)"
if r["connections"] > 1:
    ended += f' (×{r["goaways"]} of {r["connections"]} connections)'
print(f'| {a} | {s} | {r["rss_peak_mib"]:.0f} (+{r["rss_peak_mib"]-before:.0f}) '
      f'| {r["rss_after_mib"]:.0f} (+{r["rss_after_mib"]-before:.0f}) '
      f'| {r["probe_ok"]} / {r["probe_failed"]} | {r["probe_max_ms"]:.0f} ms | {ended} |')
EOF
  done
done
