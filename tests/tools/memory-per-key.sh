#!/usr/bin/env bash
# Resident memory per million keys: writes N keys (16-byte keys, 256-byte values, each key
# once) into a fresh single-member server with etcd's `benchmark`, and prints its resident
# memory idle, after the load (peak and settled), and after a restart from the same data (what
# holding the keys costs without the load's buffers; and the restart's peak, while it rebuilt
# its index), then MiB per million keys over idle.
# Run it for kvd and for etcd (`$(tests/tools/etcd-tools.sh)/etcd`), one at a time.
# Usage:  memory-per-key.sh path/to/server N
# Needs: go (tests/tools/etcd-tools.sh builds etcdctl, etcd and benchmark once).
set -euo pipefail
exe=$(readlink -f "${1:?usage: memory-per-key.sh path/to/server N}")
n=${2:?usage: memory-per-key.sh path/to/server N}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/etcd-tools.sh" --with-benchmark)
d=$(mktemp -d)
pid=
trap 'set +e; kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$d"' EXIT

start() {
  "$exe" --name mem --data-dir "$d/data" --quota-backend-bytes $((16 << 30)) \
    --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
    --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster mem=http://127.0.0.1:23800 >>"$d/log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    "$bin/etcdctl" --endpoints 127.0.0.1:23790 get --consistency=l probe >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "the server did not answer; its log:" >&2
  tail -20 "$d/log" >&2
  exit 1
}
# Resident and peak resident memory of the server, then the resident part that is anonymous
# (heap, stacks) and the part that is file pages (a memory-mapped database), in MiB.
rss() {
  awk '/^VmRSS/{r=$2} /^VmHWM/{h=$2} /^RssAnon/{a=$2} /^RssFile/{f=$2}
    END{printf "%.0f %.0f %.0f %.0f\n", r/1024, h/1024, a/1024, f/1024}' "/proc/$pid/status"
}
# Waits until resident memory stops changing by more than 1 MiB over 2 s (allocators give
# memory back on a timer), at most 30 s.
settled() {
  local last now
  last=$(rss | cut -d' ' -f1)
  for _ in $(seq 15); do
    sleep 2
    now=$(rss | cut -d' ' -f1)
    [ $((now - last)) -le 1 ] && [ $((last - now)) -le 1 ] && break
    last=$now
  done
  rss
}

start
read -r idle _ idle_anon idle_file < <(settled)
"$bin/benchmark" --endpoints 127.0.0.1:23790 --conns 10 --clients 100 put --key-size 16 \
  --val-size 256 --sequential-keys --key-space-size "$n" --total "$n" >"$d/bench" 2>&1
read -r loaded peak loaded_anon loaded_file < <(settled)
kill "$pid"
wait "$pid" 2>/dev/null || true
start
read -r restarted restart_peak anon file < <(settled)
keys=$("$bin/etcdctl" --endpoints 127.0.0.1:23790 --command-timeout 300s get "" --prefix --count-only -w fields |
  awk '/"Count"/{print $3}')
per() { awk -v a="$1" -v b="$idle" -v n="$n" 'BEGIN{printf "%.0f", (a - b) * 1e6 / n}'; }
echo "$(basename "$exe") keys=$keys idle=${idle}MiB (anon ${idle_anon}, file ${idle_file})" \
  "loaded=${loaded}MiB (anon ${loaded_anon}, file ${loaded_file}) peak=${peak}MiB" \
  "restarted=${restarted}MiB (anon ${anon}, file ${file}) restart-peak=${restart_peak}MiB" \
  "per-million-keys: loaded=$(per "$loaded")MiB restarted=$(per "$restarted")MiB"
