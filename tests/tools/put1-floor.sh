#!/usr/bin/env bash
# put1 against its floor: one client's sequential durable puts on kvd and on the no-op server
# that does only the fsync (examples/noop-kv: one 4 KiB page overwritten and synced per put), in
# rounds that run each once (which goes first rotates: the machine drifts between runs), on one
# member (`server-cpu.sh put1`) or on three written through the leader (`cluster-put1.sh …
# leader`). With APPEND=<bytes> each round also runs the no-op as a log would write: a record of
# that many bytes appended per put (`NOOP_APPEND`; kvd's WAL record for etcd's benchmark put is
# 335 bytes) — the floor of a durable append on this machine, beside the page's.
# Prints each round's figures and ratios, then the ratios' least, median and greatest over the
# rounds and how many rounds met the target (kvd's CPU per put at most 1.2× the floor's, its
# puts/s at least 0.9×), and the user and system time per put of each.
# Usage:  [ROUNDS=5] [N=puts per run, 20000] [APPEND=bytes] put1-floor.sh path/to/kvd \
#         path/to/noop-kv one|three
# Needs: what server-cpu.sh and cluster-put1.sh need (go, python3).
set -euo pipefail
usage="usage: put1-floor.sh path/to/kvd path/to/noop-kv one|three"
kvd=$(readlink -f "${1:?$usage}")
noop=$(readlink -f "${2:?$usage}")
members=${3:?$usage}
case $members in one | three) ;; *) echo "$usage" >&2; exit 2 ;; esac
rounds=${ROUNDS:-5}
export N=${N:-20000}
here=$(cd "$(dirname "$0")" && pwd)
rows=$(mktemp) # per floor and round: CPU ratio, puts/s ratio, kvd's user and system, the floor's
trap 'rm -f "$rows"' EXIT

# One run of server `s` (kvd, page: the no-op, append: the no-op appending): "puts/s
# µs-of-CPU-per-put µs-user µs-system" (three members: summed over them).
run() {
  local exe=$kvd out
  local -a env=()
  case $1 in
    page) exe=$noop env=(NOOP_FSYNC=1) ;;
    append) exe=$noop env=(NOOP_FSYNC=1 "NOOP_APPEND=$APPEND") ;;
  esac
  if [ "$members" = one ]; then
    out=$(env "${env[@]}" "$here/server-cpu.sh" "$exe" put1)
    printf '%s\n' "$out" | tr '=' ' ' | awk '/ req\/s /{printf "%.0f %s %s %s\n", $4, $6, $8, $10}'
  else
    out=$(env "${env[@]}" "$here/cluster-put1.sh" "$exe" leader)
    printf '%s\n' "$out" | awk '/ puts\/s$/{r=$(NF-1)} / user .* system .* per put$/{u+=$3; y+=$6}
      /^total /{c=$5} END{printf "%.0f %s %s %s\n", r, c, u, y}'
  fi
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", a / b}'; }

servers=(kvd page)
[ -n "${APPEND:-}" ] && servers+=(append)
declare -A res
for i in $(seq "$rounds"); do
  # This round's order: the list rotated by the round's number.
  k=${#servers[@]}
  for j in $(seq 0 $((k - 1))); do
    s=${servers[$(((i + j) % k))]}
    res[$s]=$(run "$s")
    read -r r c _ <<<"${res[$s]}"
    [ -n "$c" ] || { echo "round $i: $s printed no figures" >&2; exit 1; }
  done
  read -r kr kc ku ks <<<"${res[kvd]}"
  line="round $i: kvd $kr puts/s, $kc us/put (user $ku, system $ks)"
  for s in "${servers[@]:1}"; do
    read -r r c u y <<<"${res[$s]}"
    cr=$(ratio "$kc" "$c") rr=$(ratio "$kr" "$r")
    echo "$s $cr $rr $ku $ks $u $y" >>"$rows"
    line+="; $s $r puts/s, $c us/put (user $u, system $y):"
    line+=" CPU $(printf %.2f "$cr")x, puts/s $(printf %.2f "$rr")x"
  done
  echo "$line"
done
# The least, median and greatest of column $2 of floor $1's rounds: a ratio (x), or with $3 = us,
# microseconds.
spread() {
  awk -v s="$1" -v col="$2" '$1 == s {print $col}' "$rows" | sort -n |
    awk -v u="${3:-x}" '
    { v[NR] = $1 }
    END { m = int((NR + 1) / 2); f = u == "x" ? "%.2f" : "%.1f"
      printf f "-" f "%s (median " f ")", v[1], v[NR], u, NR % 2 ? v[m] : (v[m] + v[m + 1]) / 2 }'
}
for s in "${servers[@]:1}"; do
  met=$(awk -v s="$s" '$1 == s && $2 <= 1.2 && $3 >= 0.9' "$rows" | wc -l)
  echo "$members, against the no-op's $s floor: CPU per put $(spread "$s" 2), puts/s" \
    "$(spread "$s" 3); target met in $met of $rounds rounds"
  echo "  per put, user: kvd $(spread "$s" 4 us), the floor $(spread "$s" 6 us);" \
    "system: kvd $(spread "$s" 5 us), the floor $(spread "$s" 7 us)"
done
