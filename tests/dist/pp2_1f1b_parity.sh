#!/usr/bin/env bash
# Pipeline parallelism on 2 ranks against one process, 1F1B schedule, uneven split.
# The tiny Llama recipe with 3 blocks (stage 0: embedding and blocks 0-1; stage 1: block
# 2, norm, head, loss), 4 micro-batches per step (stage 0 runs one forward ahead, then
# alternates forward and backward), 20 steps in fp32 with gradient clipping active, must
# follow the single-process loss curve within 1e-5 relative at every step.
# Usage: bash pp2_1f1b_parity.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ -f "$root/recipes/tiny.lua" ] || { echo "skipped: recipes/tiny.lua is missing"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
export OMP_NUM_THREADS=1
exec "$root/tools/compare_loss" --tetra "$tetra" --np 2 \
  --layout parallel.pipeline_parallel_size=2 --layout parallel.pipeline_schedule=1f1b \
  --tol 1e-5 "$root/recipes/tiny.lua" --set train.steps=20 --set model.n_layers=3 \
  --set train.gradient_accumulation_steps=4 --set train.max_grad_norm=0.5
