#!/usr/bin/env bash
# etcd's snapshots, restored by kvd and by etcdutl; saved from kvd and from etcd.
#
# Loads a single etcd member with SIZE MiB (4 KiB values, 64-byte keys, each key once, with
# etcd's `benchmark`), saves its snapshot (`etcdctl snapshot save`), then in ROUNDS rounds,
# order alternating, restores that file with `etcdutl snapshot restore` and with `kvd snapshot
# restore`, each from a cold page cache (dropped before each run), and prints wall time and
# peak resident memory (/usr/bin/time). Then a kvd member is started on the restored data, and
# `etcdctl snapshot save` is timed against it and against the etcd member (cold cache too).
# Usage:  restore-compare.sh path/to/kvd SIZE_MIB [ROUNDS]
#   WORK  where the data goes (default: a new directory under /var/tmp; it needs about
#         6 × SIZE MiB free: etcd's data and its snapshot, 1.6 × SIZE each with 4 KiB values,
#         and one restored copy)
# Needs: go (etcd-tools.sh builds etcd, etcdctl, etcdutl and benchmark), root (to drop the
# page cache between runs), /usr/bin/time.
set -euo pipefail
kvd=$(readlink -f "${1:?usage: restore-compare.sh path/to/kvd SIZE_MIB [ROUNDS]}")
size=${2:?usage: restore-compare.sh path/to/kvd SIZE_MIB [ROUNDS]}
rounds=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/etcd-tools.sh" --with-benchmark --with-etcdutl)
work=${WORK:-$(mktemp -d /var/tmp/restore-compare.XXXXXX)}
mkdir -p "$work"
pids=()
trap 'set +e; for p in "${pids[@]}"; do kill $p 2>/dev/null; wait $p 2>/dev/null; done; rm -rf "$work"' EXIT
ctl() { "$bin/etcdctl" --endpoints 127.0.0.1:23790 --command-timeout 10m "$@"; }
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }

start() { # start <server> <data dir>
  "$1" --name rc --data-dir "$2" --quota-backend-bytes $(((size * 3) << 20)) \
    --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
    --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster rc=http://127.0.0.1:23800 >>"$work/server.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 3000); do
    ctl get --consistency=l probe >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "the server did not answer; its log:" >&2
  tail -20 "$work/server.log" >&2
  exit 1
}
stop() {
  local p=${pids[-1]}
  kill "$p"
  wait "$p" 2>/dev/null || true
  unset 'pids[-1]'
}
# Runs a command under /usr/bin/time; prints "seconds peak-MiB".
timed() {
  /usr/bin/time -f '%e %M' -o "$work/time" "$@" >>"$work/tools.log" 2>&1
  awk '{printf "%s %.0f\n", $1, $2 / 1024}' "$work/time"
}

keys=$(((size << 20) / 4096))
start "$bin/etcd" "$work/etcd"
echo "loading $keys keys ($size MiB of values) into etcd..." >&2
"$bin/benchmark" --endpoints 127.0.0.1:23790 --conns 10 --clients 100 put --key-size 64 \
  --val-size 4096 --sequential-keys --key-space-size "$keys" --total "$keys" >"$work/bench" 2>&1
ctl snapshot save "$work/etcd.snap" >>"$work/tools.log" 2>&1
echo "snapshot: $(stat -c %s "$work/etcd.snap") bytes" >&2

echo "round tool seconds peak_MiB"
for r in $(seq "$rounds"); do
  order="etcdutl kvd"
  [ $((r % 2)) = 0 ] && order="kvd etcdutl"
  for tool in $order; do
    out=$work/restored-$tool
    rm -rf "$out"
    cold
    if [ "$tool" = etcdutl ]; then
      res=$(timed "$bin/etcdutl" snapshot restore "$work/etcd.snap" --data-dir "$out")
    else
      res=$(timed "$kvd" snapshot restore "$work/etcd.snap" --data-dir "$out")
    fi
    echo "$r restore-$tool $res"
    # Only one restored copy at a time on the disk; the last kvd one serves the save below.
    if [ "$tool" = etcdutl ] || [ "$r" != "$rounds" ]; then
      rm -rf "$out"
    fi
  done
done

# Saving: from the etcd member loaded above, and from kvd on the data it restored.
save() { # save <name>
  rm -f "$work/saved.snap"
  cold
  echo "$1 $(timed "$bin/etcdctl" --endpoints 127.0.0.1:23790 --command-timeout 30m snapshot save "$work/saved.snap")"
}
for r in $(seq "$rounds"); do
  echo "$r $(save save-etcd)"
done
stop
start "$kvd" "$work/restored-kvd"
for r in $(seq "$rounds"); do
  echo "$r $(save save-kvd)"
done
