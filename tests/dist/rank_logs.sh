#!/usr/bin/env bash
# log.log_file: each rank writes its own text log ({rank} in the path, or .rank<N> added
# when there is no placeholder): every line names the rank that wrote it, one per step
# and a closing summary line, while only rank 0 prints progress. The ranks log the
# global loss (averaged over them), so their losses agree.
# Usage: bash rank_logs.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

out="$(timeout -k 10 120 mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" \
        --set parallel.data_parallel_size=2 --set train.steps=3 \
        --set "log.log_file=$tmp/run-{rank}.log" 2>&1)" || fail "run failed: $out"
for r in 0 1; do
  [ -f "$tmp/run-$r.log" ] || fail "no log for rank $r"
  n=$(grep -c ' step [0-9]*/3 ' "$tmp/run-$r.log")
  [ "$n" -eq 3 ] || fail "rank $r log has $n step lines, want 3"
  grep -q ' done: 3 steps ' "$tmp/run-$r.log" || fail "rank $r log has no summary line"
  [ "$(grep -vc "Z rank $r | " "$tmp/run-$r.log")" -eq 0 ] || fail "rank $r log has lines not naming rank $r"
done
loss0="$(grep ' step ' "$tmp/run-0.log" | sed -E 's/.*loss ([0-9.]+).*/\1/' | tr '\n' ' ')"
loss1="$(grep ' step ' "$tmp/run-1.log" | sed -E 's/.*loss ([0-9.]+).*/\1/' | tr '\n' ' ')"
[ "$loss0" = "$loss1" ] || fail "ranks logged different losses: '$loss0' vs '$loss1'"
[ "$(echo "$out" | grep -oE 'step +3/3' | wc -l)" -eq 1 ] || fail "progress not printed exactly once: $out"

timeout -k 10 120 mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" \
  --set parallel.data_parallel_size=2 --set train.steps=2 \
  --set "log.log_file=$tmp/plain.log" >/dev/null 2>&1 || fail "run without placeholder failed"
[ -f "$tmp/plain.log.rank0" ] && [ -f "$tmp/plain.log.rank1" ] || fail "no .rank<N> files: $(ls "$tmp")"
echo "rank logs ok: $loss0"
