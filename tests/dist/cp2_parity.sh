#!/usr/bin/env bash
# Context parallelism on 2 ranks against one process.
# The tiny Llama recipe (sequence 32 cut into 4 chunks of 8: rank 0 holds chunks 0 and 3,
# rank 1 chunks 1 and 2), 20 steps in fp32 with gradient clipping active, must follow the
# single-process loss curve within 1e-5 relative at every step (tools/compare_loss):
# attention gathers the keys and values of the other rank (their gradients come back by
# reduce-scatter), each rank's loss is the mean over its tokens and the gradients are
# averaged over the cp group.
# Usage: bash cp2_parity.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ -f "$root/recipes/tiny.lua" ] || { echo "skipped: recipes/tiny.lua is missing"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
export OMP_NUM_THREADS=1
exec "$root/tools/compare_loss" --tetra "$tetra" --np 2 --layout parallel.context_parallel_size=2 \
  --tol 1e-5 "$root/recipes/tiny.lua" --set train.steps=20 --set train.max_grad_norm=0.5
