#!/usr/bin/env bash
# Tensor parallelism 2 x data parallelism 2 on 4 ranks against one process: the tiny
# Llama recipe, 20 steps in fp32 with gradient clipping active, must follow the
# single-process loss curve within 1e-5 relative at every step (tools/compare_loss).
# The DP gradient average runs over the dp group only; the TP pair of each DP rank shares
# its batch rows.
# Usage: bash tp2_dp2_parity.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ -f "$root/recipes/tiny.lua" ] || { echo "skipped: recipes/tiny.lua is missing"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
exec "$root/tools/compare_loss" --tetra "$tetra" --np 4 --layout parallel.tensor_parallel_size=2 \
  --layout parallel.data_parallel_size=2 --tol 1e-5 "$root/recipes/tiny.lua" \
  --set train.steps=20 --set train.max_grad_norm=0.5
