#!/usr/bin/env bash
# Pipeline parallelism 2 x data parallelism 2 on 4 ranks against one process: the tiny
# Llama recipe, 1F1B with 2 micro-batches per DP rank, 20 steps in fp32 with gradient
# clipping active, must follow the single-process loss curve within 1e-5 relative at
# every step (tools/compare_loss). Each stage averages its own parameters' gradients over
# its dp group; the gradient norm adds over the stages.
# Usage: bash pp2_dp2_parity.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ -f "$root/recipes/tiny.lua" ] || { echo "skipped: recipes/tiny.lua is missing"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
export OMP_NUM_THREADS=1
exec "$root/tools/compare_loss" --tetra "$tetra" --np 4 \
  --layout parallel.pipeline_parallel_size=2 --layout parallel.data_parallel_size=2 \
  --tol 1e-5 "$root/recipes/tiny.lua" --set train.steps=20 \
  --set train.gradient_accumulation_steps=2 --set train.max_grad_norm=0.5
