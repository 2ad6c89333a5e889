#!/usr/bin/env bash
# Data parallelism on this machine: the same global batch trained by one process (all
# cores) and by 2 DP ranks (half the cores each). Prints one JSON line per run from
# tools/bench/dp.lua: step time, tokens/s, and the share of gradient communication left
# exposed after overlapping it with backward.
#   tools/bench/dp.sh [path/to/tetra] [--set key=value ...]
set -eu
root="$(cd "$(dirname "$0")/../.." && pwd)"
tetra="${1:-$root/build/tetra}"
[ $# -gt 0 ] && shift
cores=$(nproc)
common=(--set train.steps=6 --set train.warmup_steps=1 --set train.batch_size=8 --set model.seq_len=128 "$@")
echo "# 1 process, OMP_NUM_THREADS=$cores"
OMP_NUM_THREADS=$cores "$tetra" run "$root/tools/bench/dp.lua" "${common[@]}" | grep '^{'
echo "# 2 ranks (data_parallel_size=2), OMP_NUM_THREADS=$((cores / 2)) each"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=$((cores / 2 > 0 ? cores / 2 : 1)) \
  "$tetra" run "$root/tools/bench/dp.lua" "${common[@]}" \
  --set parallel.data_parallel_size=2 | grep '^{'
