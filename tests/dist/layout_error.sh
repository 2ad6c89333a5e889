#!/usr/bin/env bash
# A layout whose product differs from the number of processes is one error line, printed
# once (by rank 0), that says what was launched and what the layout needs; the job exits
# non-zero without hanging.
# Usage: bash layout_error.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ -f "$root/recipes/tiny.lua" ] || { echo "skipped: recipes/tiny.lua is missing"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
# refused_once WHAT MESSAGE --set ...: a 2-rank run that must fail (no hang) with MESSAGE
# printed exactly once (by rank 0).
refused_once() {
  local what="$1" msg="$2"
  shift 2
  local out rc n
  out="$(timeout 120 mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" "$@" 2>&1)"
  rc=$?
  n=$(echo "$out" | grep -c "$msg")
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$n" -ne 1 ]; then
    echo "FAIL: $what: exit $rc, the message appeared $n times (want once):"
    echo "$out" | head -n 20
    exit 1
  fi
}

refused_once "data_parallel_size=3 on 2 ranks" "needs 3 processes" \
  --set parallel.data_parallel_size=3 --set train.batch_size=6
# Pipeline, context and tensor parallelism run in fp32 only for now.
for dim in pipeline context tensor; do
  refused_once "${dim}_parallel_size=2 in bf16" "${dim}_parallel_size=2: train.precision must be fp32" \
    --set parallel.${dim}_parallel_size=2 --set train.precision=bf16 --set train.steps=2
done
