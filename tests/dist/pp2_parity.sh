#!/usr/bin/env bash
# Pipeline parallelism on 2 ranks against one process, GPipe schedule.
# The tiny Llama recipe (2 blocks: stage 0 holds the embedding and block 0, stage 1
# block 1, the final norm, the head and the loss), 2 micro-batches per step (every
# forward, then every backward), 20 steps in fp32 with gradient clipping active (the norm
# summed over both stages), must follow the single-process loss curve within 1e-5
# relative at every step (tools/compare_loss).
# Usage: bash pp2_parity.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ -f "$root/recipes/tiny.lua" ] || { echo "skipped: recipes/tiny.lua is missing"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
export OMP_NUM_THREADS=1
exec "$root/tools/compare_loss" --tetra "$tetra" --np 2 \
  --layout parallel.pipeline_parallel_size=2 --layout parallel.pipeline_schedule=gpipe \
  --tol 1e-5 "$root/recipes/tiny.lua" --set train.steps=20 \
  --set train.gradient_accumulation_steps=2 --set train.max_grad_norm=0.5
