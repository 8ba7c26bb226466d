#!/usr/bin/env bash
# Builds Kubernetes' kube-apiserver from the Go module proxy, once, into a cache, and prints the
# directory holding it. The migration test points one at an etcd cluster, moves the cluster to
# kvd, and points it at kvd.
#   KVD_KUBE_VERSION  (default 1.34.3)
#   KVD_TOOLS_DIR     (default ~/.cache/kvd-tools)
# Needs: go (and the module proxy). About 10 minutes on two cores the first time, nothing after.
set -euo pipefail
ver=${KVD_KUBE_VERSION:-1.34.3}
dir=${KVD_TOOLS_DIR:-$HOME/.cache/kvd-tools}/kube-apiserver-v$ver
bin=$dir/bin
mkdir -p "$bin"
if [ ! -x "$bin/kube-apiserver" ]; then
  src=$dir/src
  mkdir -p "$src"
  (
    cd "$src"
    [ -f go.mod ] || go mod init kvd-tools/kube-apiserver >/dev/null 2>&1
    export GOFLAGS=-mod=mod
    # k8s.io/kubernetes's go.mod points its staging modules at local paths; a module that
    # builds it names each at the matching v0.x release instead.
    mod=$(go mod download -json "k8s.io/kubernetes@v$ver" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
    for m in $(grep -E '^\s+k8s.io/[a-z0-9-]+ => ./staging' "$mod/go.mod" | awk '{print $1}'); do
      grep -q "^replace $m " go.mod || echo "replace $m => $m v0.${ver#1.}" >> go.mod
    done
    grep -q "^require k8s.io/kubernetes " go.mod || echo "require k8s.io/kubernetes v$ver" >> go.mod
    go build -o "$bin/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
    mv "$bin/kube-apiserver.tmp" "$bin/kube-apiserver"
  ) >&2
fi
echo "$bin"
