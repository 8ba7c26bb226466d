#!/usr/bin/env bash
# kvd against etcd (v3.6.5; ETCD_VERSION=v3.7.1 for 3.7) under etcd's own `benchmark` tool, in one run on this machine: in
# the clear (plain), over mutual TLS (tls), and over mutual TLS with auth on and a token
# (tls-auth). Each workload runs against a fresh etcd and a fresh kvd of MEMBERS members
# (default 1) on loopback, taking turns, both given the same certificates (made here with
# openssl: an EC P-256 CA, a server certificate for 127.0.0.1 and a client certificate), the
# load spread over every member, and prints for both: requests/s, p99 latency and the
# servers' own CPU time per request (user+sys, summed over the members: replication's cost
# included), then kvd/etcd for throughput (above 1: kvd is faster) and etcd/kvd for CPU
# (above 1: kvd is leaner), and last each server's peak resident memory (VmHWM summed over
# the members, MiB).
# Usage:  compare-etcd.sh path/to/kvd [workload ...]
#   workloads: put1 put100 range-l range-s txn-put watch lease-ka (default: put100 range-l
#   range-s); with etcd 3.7's benchmark also range-ko (a keys-only range of 1 M keys) and
#   stream-l (RangeStream of the same 1 M keys with their values), both on 1 M keys written
#   first (not counted)
#   MODES="plain tls tls-auth" (default: all three); MEMBERS=3 for three-member clusters;
#   SCALE=0.2 shortens every workload; AGAINST=path/to/other-kvd takes etcd's place (an A/B
#   of two builds: the columns headed "base" are then that build's); SERVER_FLAGS="…" adds
#   flags to both servers (e.g. --feature-gates=FastLeaseKeepAlive=false).
# Needs: go (tests/tools/etcd-tools.sh builds etcd, etcdctl and benchmark once), openssl.
set -euo pipefail
export KVD_ETCD_VERSION=${ETCD_VERSION:-${KVD_ETCD_VERSION:-v3.6.5}}
kvd=$(readlink -f "${1:?usage: compare-etcd.sh path/to/kvd [workload ...]}"); shift
workloads=${*:-put100 range-l range-s}
modes=${MODES:-plain tls tls-auth}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/etcd-tools.sh" --with-benchmark)
command -v openssl >/dev/null || { echo "compare-etcd.sh needs openssl" >&2; exit 2; }
scale=${SCALE:-1}
against=$(readlink -f "${AGAINST:-$bin/etcd}")
n() { awk -v a="$1" -v s="$scale" 'BEGIN{v=int(a*s); if (v<100) v=100; print v}'; }
work=$(mktemp -d)
members=${MEMBERS:-1}
pids=()
cleanup() { set +e; local p; for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# The certificates.
pki=$work/pki
mkdir -p "$pki"
ec() { openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$pki/$1.key" -subj "/CN=$2" "${@:3}" 2>/dev/null; }
ec ca bench-ca -x509 -days 2 -out "$pki/ca.pem"
for who in server client; do
  ec "$who" "$who" -out "$pki/$who.csr"
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >"$pki/$who.ext"
  openssl x509 -req -in "$pki/$who.csr" -CA "$pki/ca.pem" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$pki/$who.ext" -out "$pki/$who.pem" 2>/dev/null
done
tls_flags="--cacert $pki/ca.pem --cert $pki/client.pem --key $pki/client.key"
client_tls= ep=
ctl() { "$bin/etcdctl" --endpoints "$ep" $client_tls "$@"; }

start() { # server-binary mode -> starts $members members, waits until they take a write, sets up auth
  local exe=$1 mode=$2 d=$work/data-$RANDOM server_tls=() scheme=http cluster= i
  if [ "$mode" = plain ]; then
    client_tls=
  else
    scheme=https client_tls=$tls_flags
    server_tls=(--cert-file "$pki/server.pem" --key-file "$pki/server.key"
      --trusted-ca-file "$pki/ca.pem" --client-cert-auth)
  fi
  ep=
  for ((i = 0; i < members; i++)); do
    cluster+="${cluster:+,}m$i=http://127.0.0.1:$((23800 + i))"
    ep+="${ep:+,}$scheme://127.0.0.1:$((23790 + i))"
  done
  for ((i = 0; i < members; i++)); do
    local client=$scheme://127.0.0.1:$((23790 + i)) peer=http://127.0.0.1:$((23800 + i))
    "$exe" --name "m$i" --data-dir "$d/m$i" \
      --listen-client-urls "$client" --advertise-client-urls "$client" \
      --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
      --initial-cluster "$cluster" "${server_tls[@]}" ${SERVER_FLAGS:-} >"$work/server-$i.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 150); do
    ctl --dial-timeout 500ms --command-timeout 1s put __ready__ 1 >/dev/null 2>&1 && break
    sleep 0.1
  done
  ctl put foo bar >/dev/null || { echo "$exe did not start; its log:" >&2; tail -20 "$work/server-0.log" >&2; exit 1; }
  if [ "$mode" = tls-auth ]; then
    ctl user add root --new-user-password=rootpw >/dev/null
    ctl role add root >/dev/null
    ctl user grant-role root root >/dev/null
    ctl auth enable >/dev/null
  fi
}
stop() { local p; for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; pids=(); }
# The servers' CPU ticks (user+sys) and peak resident memory (MiB), summed over the members.
ticks() { local p t=0; for p in "${pids[@]}"; do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo "$t"; }
peak_mib() { local p k=0; for p in "${pids[@]}"; do k=$((k + $(awk '/^VmHWM/{print $2}' "/proc/$p/status"))); done; echo $((k / 1024)); }
hz=$(getconf CLK_TCK)

run() { # workload mode -> "rps p99ms cpu-us-per-request peak-MiB"
  local B="$bin/benchmark --endpoints $ep $client_tls" out t0 t1 total
  [ "$2" = tls-auth ] && B="$B --user root:rootpw"
  case $1 in
    range-ko|stream-l) # 1 M keys of 16 bytes with 64-byte values
      $B --conns 10 --clients 100 put --key-size 16 --sequential-keys --key-space-size 1000000 \
        --val-size 64 --total 1000000 >/dev/null 2>&1 ;;
  esac
  t0=$(ticks)
  case $1 in
    put1)    out=$($B --conns 1 --clients 1 put --key-size 8 --sequential-keys --val-size 256 --total "$(n 3000)" 2>&1) ;;
    put100)  out=$($B --conns 10 --clients 100 put --key-size 8 --sequential-keys --val-size 256 --total "$(n 60000)" 2>&1) ;;
    range-l) out=$($B --conns 10 --clients 100 range foo --consistency l --total "$(n 60000)" 2>&1) ;;
    range-s) out=$($B --conns 10 --clients 100 range foo --consistency s --total "$(n 60000)" 2>&1) ;;
    txn-put) out=$($B --conns 10 --clients 100 txn-put --key-size 8 --val-size 256 --txn-ops 4 \
               --key-space-size 100000 --total "$(n 20000)" 2>&1) ;;
    # 1,000 watchers of one key in 10 streams; every put is 1,000 events.
    watch)   out=$($B --conns 10 --clients 10 watch --watched-key-total 1000 --streams 10 \
               --watch-per-stream 100 --put-total "$(n 20000)" --put-rate 0 2>&1) ;;
    # 100 clients, a lease each, renewed one keep-alive stream at a time (KeepAliveOnce).
    lease-ka) out=$($B --conns 10 --clients 100 lease-keepalive --total "$(n 60000)" 2>&1) ;;
    # Ranges of every key, four at a time (not scaled: each is a million keys).
    range-ko) out=$($B --conns 4 --clients 4 range "" --prefix --keys-only --total 40 2>&1) ;;
    stream-l) out=$($B --conns 4 --clients 4 range "" --prefix --stream --total 40 2>&1) ;;
    *) echo "unknown workload $1" >&2; exit 2 ;;
  esac
  t1=$(ticks)
  total=$(printf '%s\n' "$out" | tr '\r' '\n' | awk '/Total:/{t=$2} /Requests\/sec:/{r=$2} END{printf "%d", t*r}')
  local rps p99 cpu
  rps=$(printf '%s\n' "$out" | tr '\r' '\n' | awk '/Requests\/sec:/{v=$2} END{print v+0}')
  p99=$(printf '%s\n' "$out" | tr '\r' '\n' | awk '/99% in/{v=$3} END{printf "%.2f", v*1000}')
  cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$hz" -v n="$total" 'BEGIN{ if (n>0) printf "%.2f", (b-a)/hz*1e6/n; else print 0}')
  [ "$rps" = 0 ] && { echo "no requests/s from the benchmark:" >&2; printf '%s\n' "$out" | tail -5 >&2; }
  echo "$rps $p99 $cpu $(peak_mib)"
}

base=etcd
[ -n "${AGAINST:-}" ] && base=base # the other build's columns
printf '%-8s %-8s | %9s %7s %7s | %9s %7s %7s | %9s %9s | %8s %8s\n' mode workload "$base-rps" p99-ms cpu-us kvd-rps p99-ms cpu-us rps-ratio cpu-ratio "$base-MiB" kvd-MiB
for mode in $modes; do
  for w in $workloads; do
    start "$against" "$mode"; read -r e_rps e_p99 e_cpu e_mib < <(run "$w" "$mode"); stop
    start "$kvd" "$mode";      read -r k_rps k_p99 k_cpu k_mib < <(run "$w" "$mode"); stop
    ratio=$(awk -v k="$k_rps" -v e="$e_rps" 'BEGIN{ if (e>0) printf "%.2f", k/e; else print "n/a"}')
    cratio=$(awk -v k="$k_cpu" -v e="$e_cpu" 'BEGIN{ if (k>0) printf "%.2f", e/k; else print "n/a"}')
    printf '%-8s %-8s | %9.1f %7s %7s | %9.1f %7s %7s | %9s %9s | %8s %8s\n' "$mode" "$w" "$e_rps" "$e_p99" "$e_cpu" \
      "$k_rps" "$k_p99" "$k_cpu" "$ratio" "$cratio" "$e_mib" "$k_mib"
  done
done
