#!/usr/bin/env bash
# Tensor parallelism on 2 ranks against one process.
# The tiny Llama recipe (4 query heads, 2 key/value heads, vocabulary 256: all split in
# two), 20 steps in fp32 with gradient clipping active, must follow the single-process
# loss curve within 1e-5 relative at every step (tools/compare_loss): each rank holds its
# slices of the same initial weights, the vocab-parallel loss equals the full one and the
# clipping norm is the whole model's.
# Usage: bash tp2_parity.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ -f "$root/recipes/tiny.lua" ] || { echo "skipped: recipes/tiny.lua is missing"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
exec "$root/tools/compare_loss" --tetra "$tetra" --np 2 --layout parallel.tensor_parallel_size=2 \
  --tol 1e-5 "$root/recipes/tiny.lua" --set train.steps=20 --set train.max_grad_norm=0.5
