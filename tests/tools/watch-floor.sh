#!/usr/bin/env bash
# Watch delivery against its floor: etcd's `benchmark watch` (compare-etcd.sh's watch workload:
# 1,000 watchers of one key in 10 streams over 10 connections, puts to that key as fast as 10
# clients go, every put 1,000 events) on one fresh single-member kvd, the no-op server
# (examples/noop-kv with NOOP_FSYNC=group: the puts waiting made durable by one fdatasync
# together, each put's event encoded once and handed to the watchers of its key, nothing
# stored) and etcd, in rounds that run each once (which goes first rotates: the machine drifts
# between runs). The benchmark shares the machine's two cores with the server and costs several
# times the server's CPU per event, and the puts wait on the disk: its events/s has a ceiling
# no durable server passes, and the no-op's rate measures it.
# Prints for each run events/s, the server's CPU per event (user+sys), the benchmark's, and
# events per response; each round's ratios (kvd / no-op and kvd / etcd events/s, the no-op's
# / etcd's); then each ratio's least, median and greatest over the rounds.
# Usage:  [ROUNDS=5] [PUTS=puts per run, 10000] watch-floor.sh path/to/kvd path/to/noop-kv
# Needs: go (tests/tools/etcd-tools.sh builds etcd, etcdctl and benchmark once), curl.
set -euo pipefail
usage="usage: watch-floor.sh path/to/kvd path/to/noop-kv"
kvd=$(readlink -f "${1:?$usage}")
noop=$(readlink -f "${2:?$usage}")
rounds=${ROUNDS:-5}
puts=${PUTS:-10000}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/etcd-tools.sh" --with-benchmark)
work=$(mktemp -d)
pid=
trap 'set +e; [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
hz=$(getconf CLK_TCK)
ep=127.0.0.1:23790

# One run on server `s` (kvd, noop, etcd): "events/s server-µs/event client-µs/event
# events/response".
run() {
  local exe d=$work/data-$1 log=$work/$1.log t0 t1 out cpu ev resp
  local -a env=()
  case $1 in kvd) exe=$kvd ;; noop) exe=$noop env=(NOOP_FSYNC=group) ;; etcd) exe=$bin/etcd ;; esac
  env "${env[@]}" "$exe" --name m0 --data-dir "$d" --listen-client-urls "http://$ep" \
    --advertise-client-urls "http://$ep" --listen-peer-urls http://127.0.0.1:23800 \
    --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster m0=http://127.0.0.1:23800 >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 150); do
    "$bin/etcdctl" --endpoints "$ep" put __ready__ 1 >/dev/null 2>&1 && break
    sleep 0.1
  done
  t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  # The benchmark's own CPU (user and system) from bash's `time`, on the last line.
  out=$( { TIMEFORMAT='%U %S'; time "$bin/benchmark" --endpoints "$ep" --conns 10 --clients 10 \
    watch --watched-key-total 1000 --streams 10 --watch-per-stream 100 --put-total "$puts" \
    --put-rate 0 2>&1; } 2>&1 | tr '\r' '\n')
  t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  cpu=$(printf '%s\n' "$out" | tail -1)
  ev= resp=
  if [ "$1" != noop ]; then
    local m
    m=$(curl -s "http://$ep/metrics")
    ev=$(printf '%s\n' "$m" | awk '/^etcd_debugging_mvcc_events_total /{print $2}')
    # kvd counts the responses with events; etcd every message of its Watch streams, of which
    # 1,000 said "created".
    resp=$(printf '%s\n' "$m" | awk '/^kvd_mvcc_watch_responses_total /{print $2}
      /^grpc_server_msg_sent_total.*grpc_method="Watch"/{print $2 - 1000}')
  fi
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
  if [ "$1" = noop ]; then
    read -r ev resp < <(awk '/^noop-kv watch:/{print $3, $6}' "$log")
  fi
  rm -rf "$d"
  printf '%s\n' "$out" | awk -v t0="$t0" -v t1="$t1" -v hz="$hz" -v cpu="$cpu" -v ev="$ev" \
    -v resp="$resp" '
    /Watch events received summary/ { s = 1 }
    s && /Total:/ { total = $2 }
    s && /Requests\/sec:/ { rps = $2 }
    END {
      n = total * rps
      if (n <= 0) { print "no events received"; exit 1 }
      split(cpu, c, " ")
      printf "%.0f %.3f %.3f %s\n", rps, (t1 - t0) / hz * 1e6 / n, (c[1] + c[2]) * 1e6 / n,
        (resp > 0 ? sprintf("%.1f", ev / resp) : "-")
    }' || { echo "$1: $(printf '%s\n' "$out" | tail -5)" >&2; exit 1; }
}

servers=(kvd noop etcd)
ratios=$(mktemp -p "$work")
declare -A res
for i in $(seq "$rounds"); do
  for j in 0 1 2; do
    s=${servers[$(((i + j) % 3))]}
    res[$s]=$(run "$s")
  done
  line="round $i:"
  for s in "${servers[@]}"; do
    read -r r c b e <<<"${res[$s]}"
    line+=" $s $r events/s, $c us/event (client $b), $e events/response;"
  done
  read -r k _ <<<"${res[kvd]}"
  read -r n _ <<<"${res[noop]}"
  read -r e _ <<<"${res[etcd]}"
  row=$(awk -v k="$k" -v n="$n" -v e="$e" 'BEGIN{printf "%.3f %.3f %.3f", k / n, k / e, n / e}')
  echo "$row" >>"$ratios"
  read -r kn ke ne <<<"$row"
  echo "$line kvd/no-op ${kn}x, kvd/etcd ${ke}x, no-op/etcd ${ne}x"
done
# The least, median and greatest of column $1 of the rounds' ratios.
spread() {
  awk -v col="$1" '{print $col}' "$ratios" | sort -n | awk '
    { v[NR] = $1 }
    END { m = int((NR + 1) / 2)
      printf "%.2f-%.2fx (median %.2f)", v[1], v[NR], NR % 2 ? v[m] : (v[m] + v[m + 1]) / 2 }'
}
echo "events/s over $rounds rounds: kvd/no-op $(spread 1), kvd/etcd $(spread 2)," \
  "no-op/etcd $(spread 3)"
