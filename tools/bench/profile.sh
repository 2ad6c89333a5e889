#!/usr/bin/env bash
# tetra profile's proposal against the uniform pipeline split, measured: a Llama whose
# head is heavy (vocabulary 8192 over dim 128, 8 blocks, pp 2), profiled, then both
# splits trained under mpirun ROUNDS times each (taking turns); prints every round's
# medians and the gain (uniform / balanced step time) next to the predicted one.
#   tools/bench/profile.sh [path/to/tetra] [ROUNDS]
set -eu
root="$(cd "$(dirname "$0")/../.." && pwd)"
tetra="${1:-$root/build/tetra}"
rounds="${2:-5}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive (tetra default)} cores=$(nproc)"
"$tetra" profile "$root/recipes/llama.lua" --set model.dim=128 --set model.n_layers=8 \
  --set model.n_heads=4 --set model.n_kv_heads=4 --set model.ffn_hidden=256 \
  --set model.vocab_size=8192 --set model.seq_len=64 --set train.batch_size=8 \
  --set train.gradient_accumulation_steps=4 --set parallel.pipeline_parallel_size=2 \
  --set train.threads=1 --reps 5 --measure-steps 12 --measure-rounds "$rounds" \
  --launcher "mpirun --oversubscribe --bind-to none"
