#!/usr/bin/env bash
# tests/cuda/gpu_bf16.sh TETRA — end to end on a GPU: the recipes' Llama (tiny: dim 64, 2
# layers, GQA) trained for 20 steps on this repository's README (byte tokens) in bf16 on
# cuda:0 follows the fp32 CPU loss curve within 2e-2 at every step. Both runs start from
# the same weights (initialised on the CPU from train.seed) and see the same batches.
# The curve must also fall (by more than 1 nat), so the comparison is between two
# trainings, not two flat lines. Exit 77 (skip) without a GPU or a CUDA build.
set -euo pipefail
TETRA=${1:?usage: gpu_bf16.sh /path/to/tetra}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

source "$(dirname "$0")/need_gpus.bash"
need_gpus "$TETRA" 1 tt_cuda_linear_lowp

run() {   # run DEVICE PRECISION OUT
  "$TETRA" run "$ROOT/tools/bench/gpu_train.lua" --set train.device="$1" \
    --set train.precision="$2" --set data.mock=false --set data.input_path="$ROOT/README.md" \
    --set log.metrics_file="$3"
}
run cpu fp32 "$WORK/cpu.jsonl"
run cuda bf16 "$WORK/gpu.jsonl"

loss() { sed -E 's/.*"loss": ([-0-9.eE+]+).*/\1/' "$1"; }
paste <(loss "$WORK/cpu.jsonl") <(loss "$WORK/gpu.jsonl") | awk '
  { d = $1 - $2; if (d < 0) d = -d; if (d > worst) worst = d
    if (NR == 1) first = $1; last = $1
    printf "step %2d  cpu fp32 %.5f  cuda bf16 %.5f  |diff| %.5f\n", NR, $1, $2, d }
  END {
    if (NR != 20) { print "FAIL: " NR " steps, expected 20"; exit 1 }
    if (first - last < 1.0) { printf "FAIL: the fp32 loss fell only %.3f\n", first - last; exit 1 }
    if (worst > 2e-2) { printf "FAIL: largest |diff| %.5f > 2e-2\n", worst; exit 1 }
    printf "PASS: largest |diff| %.5f <= 2e-2\n", worst }'
