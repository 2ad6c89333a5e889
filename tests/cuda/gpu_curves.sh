#!/usr/bin/env bash
# tests/cuda/gpu_curves.sh TETRA — the loss curves of the other two precisions on a GPU
# against the CPU's (gpu_bf16.sh holds bf16, gpu_fp8.sh FP8): the recipes' Llama (tiny:
# dim 64, 2 layers, GQA) trained 20 steps on this repository's README (byte tokens) from
# the same weights and batches, in fp32 and in fp16 (loss scaling) on cuda:0, each
# against the fp32 CPU run, step by step; the curves must fall by more than 1 nat.
#   fp32: the GPU's f32 GEMMs (no TF32) differ from the CPU's only in the order of their
#         sums; bound 1e-3. Not yet measured on a GPU; on this CPU, bf16 rounding itself
#         moved the curve by 9.3e-4 at most, fp16 by 1.3e-4.
#   fp16: bound 2e-2, gpu_bf16.sh's (fp16 keeps 3 more mantissa bits than bf16).
# Exit 77 (skip) without a GPU or a CUDA build.
set -euo pipefail
TETRA=${1:?usage: gpu_curves.sh /path/to/tetra}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

source "$(dirname "$0")/need_gpus.bash"
need_gpus "$TETRA" 1

run() {   # run DEVICE PRECISION OUT
  "$TETRA" run "$ROOT/tools/bench/gpu_train.lua" --set train.device="$1" \
    --set train.precision="$2" --set data.mock=false --set data.input_path="$ROOT/README.md" \
    --set log.metrics_file="$3" >"$3.out" 2>&1 ||
    { echo "FAIL: $1 $2 did not run:"; tail -n 5 "$3.out"; exit 1; }
}
run cpu fp32 "$WORK/cpu.jsonl"
loss() { sed -E 's/.*"loss": ([-0-9.eE+]+).*/\1/' "$1"; }
fails=0
for case in fp32:1e-3 fp16:2e-2; do
  precision=${case%%:*} bound=${case#*:}
  run cuda "$precision" "$WORK/$precision.jsonl"
  paste <(loss "$WORK/cpu.jsonl") <(loss "$WORK/$precision.jsonl") | awk -v p="$precision" -v bound="$bound" '
    { d = $1 - $2; if (d < 0) d = -d; if (d > worst) worst = d
      if (NR == 1) first = $1; last = $1
      printf "step %2d  cpu fp32 %.6f  cuda %s %.6f  |diff| %.6f\n", NR, $1, p, $2, d }
    END {
      if (NR != 20) { print "FAIL: " p ": " NR " steps, expected 20"; exit 1 }
      if (first - last < 1.0) { printf "FAIL: the fp32 loss fell only %.3f\n", first - last; exit 1 }
      if (worst > bound + 0) { printf "FAIL: cuda %s: largest |diff| %.6f > %s\n", p, worst, bound; exit 1 }
      printf "PASS: cuda %s: largest |diff| %.6f <= %s\n", p, worst, bound }' || fails=1
done
exit $fails
