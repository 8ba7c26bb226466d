#!/usr/bin/env bash
# kvd against etcd v3.6.5 under etcd's own `benchmark` tool, in one run on this machine: in
# the clear (plain), over mutual TLS (tls), and over mutual TLS with auth on and a token
# (tls-auth). Each workload runs against a fresh single-member etcd and a fresh single-member
# kvd, taking turns, both given the same certificates (made here with openssl: an EC P-256
# CA, a server certificate for 127.0.0.1 and a client certificate), and prints for both:
# requests/s, p99 latency and the server process's own CPU time per request (user+sys), then
# kvd/etcd for throughput (above 1: kvd is faster) and etcd/kvd for CPU (above 1: kvd is
# leaner).
# Usage:  compare-etcd.sh path/to/kvd [workload ...]
#   workloads: put1 put100 range-l range-s (default: put100 range-l range-s)
#   MODES="plain tls tls-auth" (default: all three); SCALE=0.2 shortens every workload.
# Needs: go (tests/tools/etcd-tools.sh builds etcd, etcdctl and benchmark once), openssl.
set -euo pipefail
kvd=$(readlink -f "${1:?usage: compare-etcd.sh path/to/kvd [workload ...]}"); shift
workloads=${*:-put100 range-l range-s}
modes=${MODES:-plain tls tls-auth}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/etcd-tools.sh" --with-benchmark)
command -v openssl >/dev/null || { echo "compare-etcd.sh needs openssl" >&2; exit 2; }
scale=${SCALE:-1}
n() { awk -v a="$1" -v s="$scale" 'BEGIN{v=int(a*s); if (v<100) v=100; print v}'; }
work=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
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

start() { # server-binary mode -> starts it, waits until it takes a write, sets up auth
  local exe=$1 mode=$2 d=$work/data-$RANDOM server_tls=()
  if [ "$mode" = plain ]; then
    ep=http://127.0.0.1:23790 client_tls=
  else
    ep=https://127.0.0.1:23790 client_tls=$tls_flags
    server_tls=(--cert-file "$pki/server.pem" --key-file "$pki/server.key"
      --trusted-ca-file "$pki/ca.pem" --client-cert-auth)
  fi
  "$exe" --name bench --data-dir "$d" \
    --listen-client-urls "$ep" --advertise-client-urls "$ep" \
    --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster bench=http://127.0.0.1:23800 "${server_tls[@]}" >"$work/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 150); do
    ctl --dial-timeout 500ms --command-timeout 1s put __ready__ 1 >/dev/null 2>&1 && break
    sleep 0.1
  done
  ctl put foo bar >/dev/null || { echo "$exe did not start; its log:" >&2; tail -20 "$work/server.log" >&2; exit 1; }
  if [ "$mode" = tls-auth ]; then
    ctl user add root --new-user-password=rootpw >/dev/null
    ctl role add root >/dev/null
    ctl user grant-role root root >/dev/null
    ctl auth enable >/dev/null
  fi
}
stop() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; }
hz=$(getconf CLK_TCK)
ticks() { awk '{print $14+$15}' "/proc/$pid/stat"; }

run() { # workload mode -> "rps p99ms cpu-us-per-request"
  local B="$bin/benchmark --endpoints $ep $client_tls" out t0 t1 total
  [ "$2" = tls-auth ] && B="$B --user root:rootpw"
  t0=$(ticks)
  case $1 in
    put1)    out=$($B --conns 1 --clients 1 put --key-size 8 --sequential-keys --val-size 256 --total "$(n 3000)" 2>&1) ;;
    put100)  out=$($B --conns 10 --clients 100 put --key-size 8 --sequential-keys --val-size 256 --total "$(n 60000)" 2>&1) ;;
    range-l) out=$($B --conns 10 --clients 100 range foo --consistency l --total "$(n 60000)" 2>&1) ;;
    range-s) out=$($B --conns 10 --clients 100 range foo --consistency s --total "$(n 60000)" 2>&1) ;;
    *) echo "unknown workload $1" >&2; exit 2 ;;
  esac
  t1=$(ticks)
  total=$(printf '%s\n' "$out" | tr '\r' '\n' | awk '/Total:/{t=$2} /Requests\/sec:/{r=$2} END{printf "%d", t*r}')
  local rps p99 cpu
  rps=$(printf '%s\n' "$out" | tr '\r' '\n' | awk '/Requests\/sec:/{v=$2} END{print v+0}')
  p99=$(printf '%s\n' "$out" | tr '\r' '\n' | awk '/99% in/{v=$3} END{printf "%.2f", v*1000}')
  cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$hz" -v n="$total" 'BEGIN{ if (n>0) printf "%.1f", (b-a)/hz*1e6/n; else print 0}')
  [ "$rps" = 0 ] && { echo "no requests/s from the benchmark:" >&2; printf '%s\n' "$out" | tail -5 >&2; }
  echo "$rps $p99 $cpu"
}

printf '%-8s %-8s | %9s %7s %7s | %9s %7s %7s | %9s %9s\n' mode workload etcd-rps p99-ms cpu-us kvd-rps p99-ms cpu-us rps-ratio cpu-ratio
for mode in $modes; do
  for w in $workloads; do
    start "$bin/etcd" "$mode"; read -r e_rps e_p99 e_cpu < <(run "$w" "$mode"); stop
    start "$kvd" "$mode";      read -r k_rps k_p99 k_cpu < <(run "$w" "$mode"); stop
    ratio=$(awk -v k="$k_rps" -v e="$e_rps" 'BEGIN{ if (e>0) printf "%.2f", k/e; else print "n/a"}')
    cratio=$(awk -v k="$k_cpu" -v e="$e_cpu" 'BEGIN{ if (k>0) printf "%.2f", e/k; else print "n/a"}')
    printf '%-8s %-8s | %9.0f %7s %7s | %9.0f %7s %7s | %9s %9s\n' "$mode" "$w" "$e_rps" "$e_p99" "$e_cpu" "$k_rps" "$k_p99" "$k_cpu" "$ratio" "$cratio"
  done
done
