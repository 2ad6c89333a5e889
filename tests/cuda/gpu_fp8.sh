#!/usr/bin/env bash
# tests/cuda/gpu_fp8.sh TETRA — FP8 training on a GPU (issue 16's check): the recipes'
# Llama (tiny: dim 64, 2 layers, GQA; every Linear but the head in FP8 through cuBLASLt)
# trained 50 steps on this repository's README (byte tokens) from the same seed three
# ways: FP8 on cuda:0, bf16 on cuda:0, and FP8 emulated on the CPU. Both FP8 runs do the
# same arithmetic (the emulation pins the GPU's), so they must follow each other within
# 2e-2 at every step; FP8 must follow bf16 within 5e-2 (the CPU spec measured 0.013 over
# 20 steps; these bounds are set before any GPU run and are to be tightened from one).
# The curves must fall by more than 1 nat. Prints tokens/s of the FP8 and bf16 GPU runs.
# Exit 77 (skip) without a GPU or a CUDA build.
set -euo pipefail
TETRA=${1:?usage: gpu_fp8.sh /path/to/tetra}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

source "$(dirname "$0")/need_gpus.bash"
need_gpus "$TETRA" 1

run() {   # run DEVICE PRECISION NAME
  "$TETRA" run "$ROOT/tools/bench/gpu_train.lua" --set train.device="$1" \
    --set train.precision="$2" --set data.mock=false --set data.input_path="$ROOT/README.md" \
    --set train.steps=50 --set log.metrics_file="$WORK/$3.jsonl" | tee "$WORK/$3.out" | tail -1
}
run cuda fp8 gpu_fp8
run cuda bf16 gpu_bf16
run cpu fp8 cpu_fp8

loss() { sed -E 's/.*"loss": ([-0-9.eE+]+).*/\1/' "$1"; }
paste <(loss "$WORK/gpu_fp8.jsonl") <(loss "$WORK/cpu_fp8.jsonl") <(loss "$WORK/gpu_bf16.jsonl") | awk '
  function abs(x) { return x < 0 ? -x : x }
  { e = abs($1 - $2); b = abs($1 - $3)
    if (e > we) we = e; if (b > wb) wb = b
    if (NR == 1) first = $1; last = $1
    printf "step %2d  cuda fp8 %.5f  cpu fp8 %.5f  cuda bf16 %.5f\n", NR, $1, $2, $3 }
  END {
    if (NR != 50) { print "FAIL: " NR " steps, expected 50"; exit 1 }
    if (first - last < 1.0) { printf "FAIL: the FP8 loss fell only %.3f\n", first - last; exit 1 }
    if (we > 2e-2) { printf "FAIL: cuda fp8 vs cpu fp8: largest |diff| %.5f > 2e-2\n", we; exit 1 }
    if (wb > 5e-2) { printf "FAIL: cuda fp8 vs cuda bf16: largest |diff| %.5f > 5e-2\n", wb; exit 1 }
    printf "PASS: fp8 gpu vs cpu emulation %.5f <= 2e-2, fp8 vs bf16 %.5f <= 5e-2\n", we, wb }'
