#!/usr/bin/env bash
# Builds kvd's container image: kvd built with the `image` profile (the release build, with
# link-time optimization over the whole program: a smaller binary) and profile-guided
# optimization (tests/tools/pgo-build.sh), or KVD_BIN, stripped, with the dynamic loader and the
# libraries it links, into a context for the repository's Containerfile, and then `podman
# build` (or `docker build`: CONTAINER_TOOL=docker).
# Usage:  tests/tools/image.sh [tag]          (default tag: kvd:latest)
#   KVD_BIN=path/to/kvd   use that binary instead of building one (the builds take minutes)
#   PGO=0                 build kvd without profile-guided optimization (target/image/kvd):
#                         no training run, and none of what it needs
# Needs: podman (apt-get install -y podman runc) or docker; strip and ldd (binutils, libc-bin);
# for the profile-guided build, what pgo-build.sh needs (go, openssl, python3).
set -euo pipefail
tag=${1:-kvd:latest}
here=$(cd "$(dirname "$0")/../.." && pwd)
tool=${CONTAINER_TOOL:-podman}
bin=${KVD_BIN:-}
if [ -z "$bin" ] && [ "${PGO:-1}" != 0 ]; then
  bin=$(PROFILE=image "$here/tests/tools/pgo-build.sh" kvd)
elif [ -z "$bin" ]; then
  (cd "$here" && cargo build --profile image -p kvd)
  bin=$here/target/image/kvd
fi
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
root=$ctx/rootfs
mkdir -p "$root/usr/local/bin" "$root/etc" "$ctx/data/kvd"
strip -o "$root/usr/local/bin/kvd" "$bin"
# What the binary links (ldd), at the paths the loader looks for them.
ldd "$bin" | awk '/=> \//{print $3} /^\t\/lib/{print $1}' | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
echo 'kvd:x:65532:65532:kvd:/var/lib/kvd:/nonexistent' >"$root/etc/passwd"
echo 'kvd:x:65532:' >"$root/etc/group"
echo 'hosts: files dns' >"$root/etc/nsswitch.conf"
chmod 700 "$ctx/data/kvd"
cp "$here/Containerfile" "$ctx/Containerfile"
"$tool" build -q -t "$tag" -f "$ctx/Containerfile" "$ctx" >/dev/null
size=$("$tool" image inspect "$tag" --format '{{.Size}}')
echo "$tag $size"
