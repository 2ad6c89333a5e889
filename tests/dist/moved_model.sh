#!/usr/bin/env bash
# Layouts after the model moves: on a GPU, train.setup replaces every parameter with a new
# tensor on the device (tetra.train.device.move_model), so whatever kept a parameter from
# before (a plan, a placement, a tied-weights list) holds a stale CPU tensor there, which
# the CPU runs never showed: a pipeline with tied embeddings failed its first step on
# every GPU ("tied parameter ... has no gradient after backward"). TETRA_TEST_MOVE_MODEL=1
# makes the CPU run do the same (a new tensor for every parameter); the tied pipeline
# rows of layouts.txt (Llama and GPT-2, 1F1B, and beside tensor and data parallelism with
# ZeRO-1) must still equal one process.
# Usage: bash moved_model.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
status=0
common=(--set train.steps=6 --set train.lr=3e-3 --set train.max_grad_norm=0.5
        --set train.gradient_accumulation_steps=2 --set model.tie_embeddings=true)
gpt2=(--set model.vocab_size=256 --set model.dim=64 --set model.n_layers=2
      --set model.n_heads=4 --set model.ffn_hidden=128 --set model.seq_len=32)
case_() {   # NAME NP RECIPE LAYOUT... -- SETTINGS...
  local name=$1 np=$2 recipe=$3; shift 3
  local layout=() sets=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do layout+=(--layout "$1"); shift; done
  shift
  sets=("$@")
  stop_if_failed
  if ! bash tools/compare_loss --tetra "$tetra" --np "$np" --env TETRA_TEST_MOVE_MODEL=1 \
       "${layout[@]}" "$recipe" "${common[@]}" "${sets[@]}" >"$work/$name.log" 2>&1; then
    echo "FAIL: $name"; tail -n 8 "$work/$name.log"; status=1
  else
    echo "ok: $name: $(tail -n 1 "$work/$name.log")"
  fi
}
case_ llama_pp2_tied 2 recipes/tiny.lua parallel.pipeline_parallel_size=2 --
case_ gpt2_pp2_tied 2 recipes/gpt2.lua parallel.pipeline_parallel_size=2 -- "${gpt2[@]}" \
  --set train.warmup_steps=2
case_ llama_tp2_pp2_tied_dp2_zero1 8 recipes/tiny.lua parallel.tensor_parallel_size=2 \
  parallel.pipeline_parallel_size=2 parallel.data_parallel_size=2 parallel.zero_stage=1 --
exit "$status"
