#!/usr/bin/env bash
# fp16 dynamic loss scaling under data parallelism on 2 ranks against one process.
# tests/dist/fp16_overflow.lua: the tiny Llama in fp16 (emulated) for 12 steps, an inf
# injected into one gradient on the last rank only at step 5. Both ranks must skip step 5
# (the recipe fails otherwise) and the curve must follow the single process, which skips
# the same step, within 1e-5 relative at every step (tools/compare_loss), with plain DP
# and with ZeRO-1 (where each rank checks only its own gradient shards).
# Usage: bash dp2_fp16_parity.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
status=0
for zero in 0 1; do
  echo "== parallel.zero_stage=$zero"
  "$root/tools/compare_loss" --tetra "$tetra" --np 2 --layout parallel.data_parallel_size=2 \
    --layout parallel.zero_stage=$zero --tol 1e-5 \
    "$root/tests/dist/fp16_overflow.lua" --set train.steps=12 --set train.max_grad_norm=0.5 \
    || status=1
done
exit $status
