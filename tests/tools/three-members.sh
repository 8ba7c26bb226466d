# Sourced by the tools that start a three-member cluster of one build on loopback
# (cluster-put1.sh, cluster-instructions.sh, restart-memory.sh). Expects: exe (the server), d
# (a scratch directory), bin (etcd-tools.sh's directory), pids (an array). Member i listens on
# 2379i for clients and 2380i for peers, keeps its data in $d/m$i and logs to $d/m$i.log.
cluster=m0=http://127.0.0.1:23800,m1=http://127.0.0.1:23801,m2=http://127.0.0.1:23802
eps=127.0.0.1:23790,127.0.0.1:23791,127.0.0.1:23792

start_member() { # member index
  local c=http://127.0.0.1:$((23790 + $1)) p=http://127.0.0.1:$((23800 + $1))
  "$exe" --name "m$1" --data-dir "$d/m$1" --listen-client-urls "$c" --advertise-client-urls "$c" \
    --listen-peer-urls "$p" --initial-advertise-peer-urls "$p" --initial-cluster "$cluster" \
    >>"$d/m$1.log" 2>&1 &
  pids[$1]=$!
}

# Waits (15 s at most) until endpoints $1 take a write of key $2; fails if they do not.
took_write() {
  for _ in $(seq 150); do
    "$bin/etcdctl" --endpoints "$1" --dial-timeout 500ms --command-timeout 2s \
      put "$2" v >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

# Starts the three members and waits until the cluster takes a write of key $1.
start_cluster() {
  local i
  for i in 0 1 2; do start_member "$i"; done
  took_write "$eps" "$1" && return 0
  echo "the cluster took no write; member 0's log:" >&2
  tail -20 "$d/m0.log" >&2
  return 1
}

# Prints the endpoint (host:port) of the leader among endpoints $1, as their members see it.
leader_endpoint() {
  "$bin/etcdctl" --endpoints "$1" endpoint status -w json | python3 -c '
import json, sys
for s in json.load(sys.stdin):
    if s["Status"]["leader"] == s["Status"]["header"]["member_id"]:
        print(s["Endpoint"])'
}
