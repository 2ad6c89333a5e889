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
out="$(timeout 120 mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" \
        --set parallel.data_parallel_size=3 --set train.batch_size=6 2>&1)"
rc=$?
echo "$out" | grep "needs"
n=$(echo "$out" | grep -c "needs 3 processes")
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$n" -ne 1 ]; then
  echo "FAIL: exit $rc, the layout message appeared $n times (want once):"
  echo "$out" | head -n 20
  exit 1
fi

# Pipeline parallelism runs in fp32 only: another precision is refused once, by rank 0.
out="$(timeout 120 mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" \
        --set parallel.pipeline_parallel_size=2 --set train.precision=bf16 \
        --set train.steps=2 2>&1)"
rc=$?
n=$(echo "$out" | grep -c "pipeline_parallel_size=2: train.precision must be fp32")
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$n" -ne 1 ]; then
  echo "FAIL: pipeline_parallel_size=2 in bf16: exit $rc, the message appeared $n times (want once):"
  echo "$out" | head -n 20
  exit 1
fi

# Context parallelism runs in fp32 only: another precision is refused once, by rank 0.
out="$(timeout 120 mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" \
        --set parallel.context_parallel_size=2 --set train.precision=bf16 \
        --set train.steps=2 2>&1)"
rc=$?
n=$(echo "$out" | grep -c "context_parallel_size=2: train.precision must be fp32")
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$n" -ne 1 ]; then
  echo "FAIL: context_parallel_size=2 in bf16: exit $rc, the message appeared $n times (want once):"
  echo "$out" | head -n 20
  exit 1
fi

# Tensor parallelism runs in fp32 only: another precision is refused once, by rank 0.
out="$(timeout 120 mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" \
        --set parallel.tensor_parallel_size=2 --set train.precision=bf16 \
        --set train.steps=2 2>&1)"
rc=$?
n=$(echo "$out" | grep -c "tensor_parallel_size=2: train.precision must be fp32")
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$n" -ne 1 ]; then
  echo "FAIL: tensor_parallel_size=2 in bf16: exit $rc, the message appeared $n times (want once):"
  echo "$out" | head -n 20
  exit 1
fi
