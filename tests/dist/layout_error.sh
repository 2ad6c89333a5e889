#!/usr/bin/env bash
# A layout that cannot run is one error line, printed once (by rank 0), that names the
# sizes and the rule; the job exits non-zero without hanging, before the model is built.
# Usage: bash layout_error.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ -f "$root/recipes/tiny.lua" ] || { echo "skipped: recipes/tiny.lua is missing"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
source "$root/tests/memory_cap.bash" "$tetra"
# refused_once WHAT MESSAGE --set ...: a run on $NP ranks (default 2) that must fail (no
# hang) with MESSAGE printed exactly once (by rank 0).
refused_once() {
  local what="$1" msg="$2"
  shift 2
  local out rc n
  out="$(timeout -k 10 120 mpirun --oversubscribe -np "${NP:-2}" "$tetra" run "$root/recipes/tiny.lua" "$@" 2>&1)"
  rc=$?
  n=$(echo "$out" | grep -c "$msg")
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] || [ "$n" -ne 1 ]; then
    echo "FAIL: $what: exit $rc, the message appeared $n times (want once):"
    echo "$out" | head -n 20
    exit 1
  fi
}

refused_once "data_parallel_size=3 on 2 ranks" "needs 3 processes" \
  --set parallel.data_parallel_size=3 --set train.batch_size=6
# Rules tetra.parallel.layout owns, each one line before anything is built.
NP=4 refused_once "key/value heads tp does not share out" \
  "parallel.tensor_parallel_size (4) must be a multiple of model.n_kv_heads (3)" \
  --set parallel.tensor_parallel_size=4 --set model.n_heads=12 --set model.n_kv_heads=3 --set model.dim=48
refused_once "sequence parallelism without tp" "parallel.sequence_parallel=true needs parallel.tensor_parallel_size > 1" \
  --set parallel.data_parallel_size=2 --set parallel.sequence_parallel=true
refused_once "virtual stages without the interleaved schedule" \
  "parallel.virtual_pipeline_size=2 needs parallel.pipeline_schedule=interleaved_1f1b" \
  --set parallel.pipeline_parallel_size=2 --set parallel.virtual_pipeline_size=2 --set model.n_layers=4
refused_once "interleaving with micro-batches the stages do not divide" \
  "train.gradient_accumulation_steps (1, the micro-batches) must be a multiple of parallel.pipeline_parallel_size (2)" \
  --set parallel.pipeline_parallel_size=2 --set parallel.pipeline_schedule=interleaved_1f1b \
  --set parallel.virtual_pipeline_size=2 --set model.n_layers=4
refused_once "uneven context chunks" "model.seq_len (30) must be a multiple of 2 x parallel.context_parallel_size (4)" \
  --set parallel.context_parallel_size=2 --set model.seq_len=30

# A refused layout of a big model stops before the model is built: llama-1b (about 1.2B
# parameters, 4.9 GB of f32 weights) with tp 2 x pp 2 on 4 ranks and a width tp does not
# divide (the MLP's hidden units), each rank held to 4 GB of address space, so that a
# model built before the check fails the run instead of naming the rule. The message
# appears once in every one of several runs (rank 0 reports it; the other ranks wait for
# it before exiting).
for i in 1 2 3 4 5; do
  start=$(date +%s)
  out="$(cap_memory 4000000 timeout -k 10 120 mpirun --oversubscribe -np 4 "$tetra" run "$root/recipes/llama.lua" \
         --set train.model_name=llama-1b --set parallel.tensor_parallel_size=2 \
         --set parallel.pipeline_parallel_size=2 --set model.ffn_hidden=5633 2>&1)"
  rc=$? took=$(( $(date +%s) - start ))
  n=$(echo "$out" | grep -c "parallel.tensor_parallel_size (2) must divide model.ffn_hidden (5633)")
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] || [ "$n" -ne 1 ]; then
    echo "FAIL: llama-1b refused layout, run $i: exit $rc, message $n times (want once), ${took}s:"
    echo "$out" | head -n 20
    exit 1
  fi
  if echo "$out" | grep -q "parameters"; then
    echo "FAIL: llama-1b refused layout, run $i: the model was built first:"; echo "$out" | head; exit 1
  fi
done
echo PASS
