#!/usr/bin/env bash
# put1 against its floor: one client's sequential durable puts on kvd and on the no-op server
# that does only the fsync (examples/noop-kv), in rounds that alternate the two (which goes
# first alternates too: the machine drifts between runs), on one member (`server-cpu.sh put1`)
# or on three written through the leader (`cluster-put1.sh … leader`). Prints each round's
# figures and ratios, then the ratios' least, median and greatest over the rounds and how many
# rounds met the target (kvd's CPU per put at most 1.2× the no-op's, its puts/s at least 0.9×).
# Usage:  [ROUNDS=5] [N=puts per run, 20000] put1-floor.sh path/to/kvd path/to/noop-kv one|three
# Needs: what server-cpu.sh and cluster-put1.sh need (go, python3).
set -euo pipefail
usage="usage: put1-floor.sh path/to/kvd path/to/noop-kv one|three"
kvd=$(readlink -f "${1:?$usage}")
noop=$(readlink -f "${2:?$usage}")
members=${3:?$usage}
rounds=${ROUNDS:-5}
export N=${N:-20000}
here=$(cd "$(dirname "$0")" && pwd)

# One run of `exe`: "puts/s µs-of-CPU-per-put µs-user µs-system" (three members: summed).
run() {
  local exe=$1 out
  case $members in
    one)
      if [ "$exe" = "$noop" ]; then
        out=$(NOOP_FSYNC=1 "$here/server-cpu.sh" "$exe" put1)
      else
        out=$("$here/server-cpu.sh" "$exe" put1)
      fi
      printf '%s\n' "$out" | tr '=' ' ' | awk '/ req\/s /{print $4, $6, $8, $10}' ;;
    three)
      out=$("$here/cluster-put1.sh" "$exe" leader)
      printf '%s\n' "$out" | awk '/ puts\/s$/{r=$(NF-1)} / user .* system .* per put$/{u+=$3; y+=$6}
        /^total /{c=$5} END{print r, c, u, y}' ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
}

results=()
for i in $(seq "$rounds"); do
  if [ $((i % 2)) = 1 ]; then
    k=$(run "$kvd"); o=$(run "$noop")
  else
    o=$(run "$noop"); k=$(run "$kvd")
  fi
  read -r kr kc ku ks <<<"$k"
  read -r or oc ou os <<<"$o"
  [ -n "$kc" ] && [ -n "$oc" ] || { echo "round $i: a run printed no figures" >&2; exit 1; }
  line=$(awk -v kr="$kr" -v kc="$kc" -v or="$or" -v oc="$oc" 'BEGIN{
    printf "%.3f %.3f", kc / oc, kr / or }')
  results+=("$line $ku $ks $ou $os")
  read -r cr rr <<<"$line"
  printf 'round %d: kvd %.0f puts/s, %.1f us/put (user %.1f, system %.1f); ' \
    "$i" "$kr" "$kc" "$ku" "$ks"
  printf 'no-op %.0f puts/s, %.1f us/put (user %.1f, system %.1f); ' "$or" "$oc" "$ou" "$os"
  printf 'CPU %.2fx, puts/s %.2fx\n' "$cr" "$rr"
done
# The least, median and greatest of column $1 of the rounds' figures: a ratio (x), or with
# $2 = us, microseconds.
spread() {
  printf '%s\n' "${results[@]}" | awk -v col="$1" '{print $col}' | sort -n | awk -v u="${2:-x}" '
    { v[NR] = $1 }
    END { m = int((NR + 1) / 2); f = u == "x" ? "%.2f" : "%.1f"
      printf f "-" f "%s (median " f ")", v[1], v[NR], u, NR % 2 ? v[m] : (v[m] + v[m + 1]) / 2 }'
}
met=$(printf '%s\n' "${results[@]}" | awk '$1 <= 1.2 && $2 >= 0.9' | wc -l)
echo "$members: CPU per put $(spread 1) the no-op's, puts/s $(spread 2);" \
  "target met in $met of $rounds rounds"
echo "  per put, user: kvd $(spread 3 us), the no-op $(spread 5 us);" \
  "system: kvd $(spread 4 us), the no-op $(spread 6 us)"
