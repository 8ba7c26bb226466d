#!/usr/bin/env bash
# The large-database proof: kvd against etcd v3.6.5 as the database grows, one single-member
# server at a time. For each server and each size:
#   1. a small database: ~200 MB of 16 KiB values, then a steady put load (100 clients, 5,000
#      puts/s, 20 s, compacting every second) — p99 "small";
#   2. filled to SIZE GB with 16 KiB values under random keys of a key space of 1.5 × SIZE /
#      16 KiB keys, overwritten and compacted every 5 s as it fills (a large, fragmented free
#      list; the database reaches SIZE when about two thirds of the keys are written),
#      then the same put load — p99 "large", and the database size after;
#   3. peak resident memory (VmHWM) over 1–2;
#   4. a clean stop and a restart: seconds from the start to the first answered linearizable
#      read;
#   5. an online defragmentation asked for 10 s into the same put load: p99 of the puts sent
#      before it and of those sent while it ran, and how long it took (skipped, saying so, if
#      the disk cannot hold a second copy of the database).
# and the puts that failed over all of it (etcd's "request timed out" when overloaded).
# Servers: etcd and etcd-array (etcd with --backend-bbolt-freelist-type array), kvd and
# kvd-array (kvd with --freelist-type array); the default map/hash freelists otherwise.
# Usage:  large-db.sh path/to/kvd [SIZE-GB ...]        (default: 20 40)
#   SERVERS (default "etcd kvd kvd-array"), RATE (5000), CLIENTS (100), LOAD (20s),
#   DIR (where the databases go; default /var/tmp), SMALL_MB (200), LOG (a file for each run's
#   full output: every load's count, rate, p50, p99, max, and memory after the large load)
# Needs: go (builds tests/clients/go/cmd/bigdb; tests/tools/etcd-tools.sh builds etcd once),
#   free disk of about 2.2 × SIZE (the database, its WAL and a defragmentation's copy).
set -euo pipefail
kvd=$(readlink -f "${1:?usage: large-db.sh path/to/kvd [SIZE-GB ...]}"); shift
sizes=${*:-20 40}
servers=${SERVERS:-etcd kvd kvd-array}
rate=${RATE:-5000}
clients=${CLIENTS:-100}
load_for=${LOAD:-20s}
small_mb=${SMALL_MB:-200}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/etcd-tools.sh")
work=$(mktemp -d -p "${DIR:-/var/tmp}" large-db.XXXXXX)
pid=
cleanup() { set +e; [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
(cd "$here/../clients/go" && go build -o "$work/bigdb" ./cmd/bigdb)
ep=127.0.0.1:23790
value=16384

# server name -> its binary and flags
exe_of() { case $1 in etcd*) echo "$bin/etcd" ;; kvd*) echo "$kvd" ;; esac; }
flags_of() {
  case $1 in
    etcd) echo "--backend-bbolt-freelist-type map" ;;
    etcd-array) echo "--backend-bbolt-freelist-type array" ;;
    kvd) echo "--freelist-type map" ;;
    kvd-array) echo "--freelist-type array" ;;
    *) echo "large-db.sh: unknown server $1" >&2; exit 2 ;;
  esac
}

start() { # name quota-bytes; sets pid and started (seconds since the epoch, fractional)
  local name=$1 quota=$2
  started=$(date +%s.%N)
  # shellcheck disable=SC2046
  "$(exe_of "$name")" $(flags_of "$name") --name big --data-dir "$work/data" \
    --quota-backend-bytes "$quota" \
    --listen-client-urls "http://$ep" --advertise-client-urls "http://$ep" \
    --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster big=http://127.0.0.1:23800 >>"$work/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 30000); do
    if "$bin/etcdctl" --endpoints "$ep" --dial-timeout 200ms --command-timeout 1s \
      get --consistency=l probe >/dev/null 2>&1; then
      ready=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
  done
  echo "$name did not answer; its log:" >&2
  tail -20 "$work/server.log" >&2
  exit 1
}
stop() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; }
peak_mib() { awk '/^VmHWM/{printf "%.0f", $2 / 1024}' "/proc/$pid/status"; }
field() { printf '%s\n' "$1" | awk -v line="$2" -v key="$3" '$1 == line { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == key) print kv[2] } }'; }
load() { # keys [extra flags] -> bigdb load's output
  local keys=$1; shift
  "$work/bigdb" load -endpoint "$ep" -rate "$rate" -clients "$clients" -duration "$load_for" \
    -keys "$keys" -value-bytes $value -compact-every 1s "$@"
}
fill() { # keys target-bytes
  "$work/bigdb" fill -endpoint "$ep" -clients 50 -conns 10 -keys "$1" -value-bytes $value \
    -compact-every 5s -target-bytes "$2"
}

printf '%-10s %5s | %9s %9s %6s | %8s %8s | %9s | %9s | %8s %9s %9s | %6s\n' server size-GB p99-small p99-large ratio \
  db-GB fill-s peak-MiB restart-s defrag-s p99-before p99-during errors
for size in $sizes; do
  bytes=$((size * 1000 * 1000 * 1000))
  keys=$((bytes * 3 / 2 / value))
  small_keys=$((small_mb * 1000 * 1000 / value / 2))
  for s in $servers; do
    rm -rf "$work/data" "$work/server.log"
    start "$s" $((bytes * 2 + (4 << 30)))
    fill "$small_keys" $((small_mb * 1000 * 1000)) >/dev/null
    small=$(load "$small_keys")
    t0=$(date +%s)
    fill "$keys" "$bytes" >"$work/fill.out"
    fill_s=$(($(date +%s) - t0))
    large=$(load "$keys")
    peak=$(peak_mib)
    mem=$(grep -E '^(VmHWM|RssAnon|RssFile)' "/proc/$pid/status" | tr -s ' \t' ' ' | tr '\n' ' ')
    db=$(printf '%s\n' "$large" | awk -F= '/^db-bytes=/{printf "%.1f", $2 / 1e9}')
    stop
    start "$s" $((bytes * 2 + (4 << 30)))
    restart=$ready
    free=$(df -B1 --output=avail "$work" | tail -1)
    du=$(du -sb "$work/data" | cut -f1)
    if [ "$free" -gt $((du + (2 << 30))) ]; then
      defrag=$(load "$keys" -defrag-at 10s)
      d_s=$(printf '%s\n' "$defrag" | awk -F= '/^defrag seconds=/{print $2}')
      d_before=$(field "$defrag" before-defrag p99)
      d_during=$(field "$defrag" during-defrag p99)
    else
      defrag= d_s="no-room" d_before=- d_during=-
      echo "$s $size GB: the disk has $((free >> 30)) GiB free, the database $((du >> 30)) GiB: no defragmentation" >&2
    fi
    peak2=$(peak_mib)
    stop
    [ "$peak2" -gt "$peak" ] && peak=$peak2
    p_small=$(field "$small" all p99)
    p_large=$(field "$large" all p99)
    ratio=$(awk -v a="$p_small" -v b="$p_large" 'BEGIN{ if (a > 0) printf "%.2f", b / a; else print "n/a"}')
    errors=$(printf '%s\n' "$small" "$large" "${defrag:-}" "$(cat "$work/fill.out")" | tr ' ' '\n' | awk -F= '$1 == "errors" {n += $2} END {print n + 0}')
    printf '%-10s %5s | %9s %9s %6s | %8s %8s | %9s | %9s | %8s %9s %9s | %6s\n' "$s" "$size" "$p_small" "$p_large" "$ratio" \
      "$db" "$fill_s" "$peak" "$restart" "$d_s" "$d_before" "$d_during" "$errors"
    { echo "== $s $size GB"; echo "$small"; cat "$work/fill.out"; echo "$large"; echo "after the large load: $mem"
      echo "${defrag:-}"; } >>"${LOG:-/dev/null}"
  done
done
