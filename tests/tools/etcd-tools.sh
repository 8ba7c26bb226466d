#!/usr/bin/env bash
# Builds etcd v3.6's etcdctl and etcd server, and h2spec (HTTP/2 conformance), from the Go
# module proxy, once, into a cache, and prints the directory holding them. kvd's compatibility
# tests run etcdctl against kvd and the same commands against etcd, and compare what they
# print; the h2spec test runs the HTTP/2 conformance suite against kvd's client port.
# With --with-benchmark it also builds etcd's `benchmark` load generator (for the comparison
# scripts in this directory; the tests do not need it); with --with-bbolt, bbolt's command
# line (`bbolt bench`, which the pager is measured against); with --with-etcdutl, etcd's offline
# tool (the snapshot and data-file tests restore with it); --no-h2spec skips h2spec (for the
# other etcd versions the tests compare with).
#   KVD_ETCD_VERSION  (default v3.6.5)
#   KVD_TOOLS_DIR     (default ~/.cache/kvd-tools)
# Needs: go (and the module proxy). About a minute the first time, nothing after.
set -euo pipefail
ver=${KVD_ETCD_VERSION:-v3.6.5}
dir=${KVD_TOOLS_DIR:-$HOME/.cache/kvd-tools}/$ver
bin=$dir/bin
mkdir -p "$bin"
export GOFLAGS=-mod=mod

# tool <binary> <module> <version> <package with main>
tool() {
  local name=$1 module=$2 version=$3 pkg=$4
  [ -x "$bin/$name" ] && return 0
  local src=$dir/src/$name
  mkdir -p "$src"
  (
    cd "$src"
    [ -f go.mod ] || go mod init "kvd-tools/$name" >/dev/null 2>&1
    go get "$module@$version" >/dev/null 2>&1
    go build -o "$bin/$name.tmp" "$pkg"
    mv "$bin/$name.tmp" "$bin/$name"
  ) >&2
}

if [ "$ver" = v3.4.13 ]; then
  # etcd 3.4's module path has no /v3, so the proxy serves it only by the pseudo-version of its
  # v3.4.13 commit (the one Kubernetes 1.20 pinned). The server alone: the tests drive it with
  # 3.6's etcdctl.
  tool etcd go.etcd.io/etcd v0.5.0-alpha.5.0.20200910180754-dd1b699fc489 go.etcd.io/etcd
  echo "$bin"
  exit 0
fi
tool etcdctl go.etcd.io/etcd/etcdctl/v3 "$ver" go.etcd.io/etcd/etcdctl/v3
tool etcd go.etcd.io/etcd/server/v3 "$ver" go.etcd.io/etcd/server/v3
h2spec=1
for opt in "$@"; do
  case $opt in
    --no-h2spec) h2spec=0 ;;
    --with-etcdutl) tool etcdutl go.etcd.io/etcd/etcdutl/v3 "$ver" go.etcd.io/etcd/etcdutl/v3 ;;
    --with-benchmark) tool benchmark go.etcd.io/etcd/v3 "$ver" go.etcd.io/etcd/v3/tools/benchmark ;;
    --with-bbolt) tool bbolt go.etcd.io/bbolt "${BBOLT_VERSION:-v1.4.3}" go.etcd.io/bbolt/cmd/bbolt ;;
    *) echo "etcd-tools.sh: unknown option $opt" >&2; exit 2 ;;
  esac
done
if [ "$h2spec" = 1 ]; then
  tool h2spec github.com/summerwind/h2spec v2.2.1+incompatible github.com/summerwind/h2spec/cmd/h2spec
fi
echo "$bin"
