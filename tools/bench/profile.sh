#!/usr/bin/env bash
# tetra profile's proposal against the uniform pipeline split, measured: a Llama whose
# first block is about ten times costlier than each of the other eleven
# (tests/fixtures/heavy_first.lua: dim 128, seq 64, 8 micro-batches of one row, pp 2),
# profiled, then both splits trained under mpirun ROUNDS times each (taking turns); prints
# the pooled medians, each round's gain (uniform / balanced step time, the two runs side
# by side in time) and their geometric mean with its 95% interval, next to the predicted
# gain. HEAVY_HEAD=1 profiles the Llama with a heavy head instead (vocabulary 8192 over
# dim 128, 8 blocks, 4 micro-batches).
#   tools/bench/profile.sh [path/to/tetra] [ROUNDS]
set -eu
root="$(cd "$(dirname "$0")/../.." && pwd)"
tetra="${1:-$root/build/tetra}"
rounds="${2:-8}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive (tetra default)} cores=$(nproc) load=$(cut -d' ' -f1 /proc/loadavg)"
if [ "${HEAVY_HEAD:-0}" = 1 ]; then
  model=("$root/recipes/llama.lua" --set model.dim=128 --set model.n_layers=8
         --set model.n_heads=4 --set model.n_kv_heads=4 --set model.ffn_hidden=256
         --set model.vocab_size=8192 --set model.seq_len=64 --set train.batch_size=8
         --set train.gradient_accumulation_steps=4 --set parallel.pipeline_parallel_size=2
         --set train.threads=1)
  steps=12
else
  model=("$root/tests/fixtures/heavy_first.lua")
  steps=8
fi
"$tetra" profile "${model[@]}" --reps 5 --measure-steps $steps --measure-rounds "$rounds" \
  --launcher "mpirun --oversubscribe --bind-to none"
