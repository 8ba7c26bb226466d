#!/usr/bin/env bash
# Watch delivery against its floor: etcd's `benchmark watch` (compare-etcd.sh's watch workload:
# 1,000 watchers of one key in 10 streams over 10 connections, puts to that key as fast as 10
# clients go, every put 1,000 events) on a fresh kvd, the no-op server (examples/noop-kv with
# NOOP_FSYNC=group: the puts waiting made durable by one fdatasync together, each put's event
# encoded once and handed to the watchers of its key, nothing stored) and etcd, one member each
# or three (MEMBERS=3: the load spread over the members, as compare-etcd.sh spreads it; the
# no-op's leader sends each batch to its followers and waits for one, its followers forward
# their clients' puts to it and hand out the events of what they sync), in rounds that run each
# once (which goes first rotates: the machine drifts between runs). The benchmark shares the
# machine's two cores with the servers and costs several times their CPU per event, and the
# puts wait on the disk: its events/s has a ceiling no durable server passes, and the no-op's
# rate measures it.
# Prints for each run events/s, the servers' CPU per event (user+sys, summed over the members),
# the benchmark's, and events per response; each round's ratios (kvd / no-op and kvd / etcd
# events/s, the no-op's / etcd's); then each ratio's least, median and greatest over the rounds.
# Usage:  [ROUNDS=5] [PUTS=puts per run, 10000] [MEMBERS=1|3] watch-floor.sh path/to/kvd \
#         path/to/noop-kv
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
members=${MEMBERS:-1}
case $members in 1 | 3) ;; *) echo "watch-floor.sh: MEMBERS is 1 or 3" >&2; exit 2 ;; esac
pids=()
stop() { local p; for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; pids=(); }
trap 'set +e; stop; rm -rf "$work"' EXIT
hz=$(getconf CLK_TCK)
eps= # the client endpoints, comma-separated
# The servers' CPU ticks (user+sys), summed over the members.
ticks() { local p t=0; for p in "${pids[@]}"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }

# Starts $members members of server `s` (kvd, noop, etcd) and waits until they take a put. Three
# no-op members: m0 leads, m1 and m2 follow (examples/noop-kv/log.rs).
start() {
  local s=$1 exe i cluster= url peer
  eps=
  for ((i = 0; i < members; i++)); do
    cluster+="${cluster:+,}m$i=http://127.0.0.1:$((23800 + i))"
    eps+="${eps:+,}127.0.0.1:$((23790 + i))"
  done
  for ((i = 0; i < members; i++)); do
    local -a env=()
    case $s in
      kvd) exe=$kvd ;;
      etcd) exe=$bin/etcd ;;
      noop)
        exe=$noop env=(NOOP_FSYNC=group "NOOP_CLIENT=127.0.0.1:$((23790 + i))")
        if [ "$members" = 3 ] && [ "$i" = 0 ]; then
          env+=(NOOP_LOG_PEERS=127.0.0.1:23811,127.0.0.1:23812 NOOP_FORWARD_LISTEN=127.0.0.1:23820)
        elif [ "$members" = 3 ]; then
          env+=("NOOP_LOG_LISTEN=127.0.0.1:$((23810 + i))" NOOP_LEADER=127.0.0.1:23820)
        fi ;;
    esac
    url=http://127.0.0.1:$((23790 + i)) peer=http://127.0.0.1:$((23800 + i))
    env "${env[@]}" "$exe" --name "m$i" --data-dir "$work/data/m$i" --listen-client-urls "$url" \
      --advertise-client-urls "$url" --listen-peer-urls "$peer" \
      --initial-advertise-peer-urls "$peer" --initial-cluster "$cluster" >"$work/$s-$i.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 150); do
    "$bin/etcdctl" --endpoints "$eps" --dial-timeout 500ms --command-timeout 1s \
      put __ready__ 1 >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "$s did not start; its log:" >&2
  tail -20 "$work/$s-0.log" >&2
  exit 1
}

# One run on server `s`: "events/s server-µs/event client-µs/event events/response", the
# server's CPU summed over its members.
run() {
  local t0 t1 out cpu ev=0 resp=0 e m
  start "$1"
  t0=$(ticks)
  # The benchmark's own CPU (user and system) from bash's `time`, on the last line.
  out=$( { TIMEFORMAT='%U %S'; time "$bin/benchmark" --endpoints "$eps" --conns 10 --clients 10 \
    watch --watched-key-total 1000 --streams 10 --watch-per-stream 100 --put-total "$puts" \
    --put-rate 0 2>&1; } 2>&1 | tr '\r' '\n')
  t1=$(ticks)
  cpu=$(printf '%s\n' "$out" | tail -1)
  if [ "$1" != noop ]; then
    # kvd counts the responses with events; etcd every message of its Watch streams, of which
    # 1,000 said "created".
    for e in ${eps//,/ }; do
      m=$(curl -s "http://$e/metrics")
      read -r ev resp < <(printf '%s\n' "$m" | awk -v ev="$ev" -v resp="$resp" '
        /^etcd_debugging_mvcc_events_total /{ev += $2}
        /^kvd_mvcc_watch_responses_total /{resp += $2}
        /^grpc_server_msg_sent_total.*grpc_method="Watch"/{resp += $2}
        END{printf "%.0f %.0f\n", ev, resp}')
    done
    [ "$1" = etcd ] && resp=$((resp - 1000))
  fi
  stop
  if [ "$1" = noop ]; then
    read -r ev resp < <(cat "$work"/noop-*.log | awk '/^noop-kv watch:/{e += $3; r += $6} END{print e, r}')
  fi
  rm -rf "$work/data"
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
