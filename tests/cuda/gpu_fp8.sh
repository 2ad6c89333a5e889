#!/usr/bin/env bash
# tests/cuda/gpu_fp8.sh TETRA — FP8 training on a GPU (issue 16's check): the recipes'
# Llama (tiny: dim 64, 2 layers, GQA; every Linear but the head in FP8 through cuBLASLt)
# trained 50 steps on this repository's README (byte tokens) from the same seed three
# ways: FP8 on cuda:0, bf16 on cuda:0, and FP8 emulated on the CPU. The emulation sums
# fp8 products in fp32, while Hopper's FP8 tensor cores keep about 14 bits, so the two FP8
# curves agree closely at first and then drift apart as any two runs with different
# rounding do. Measured on the first H200 run: steps 1-10 within 1.6e-3 (fp8 GPU vs CPU)
# and 1.3e-3 (fp8 vs bf16); later single steps up to 0.069 and 0.049 apart, the means of
# steps 41-50 within 3.3e-3 and 8.2e-3. The bounds: every one of steps 1-10 within 5e-3
# of both, the means of steps 41-50 within 2e-2 (fp8 GPU vs CPU) and 3e-2 (fp8 vs bf16).
# The curves must fall by more than 1 nat. Prints tokens/s of the FP8 and bf16 GPU runs.
# The FP8 GPU run must end with its 20-token sample (padded windows, inference).
# Exit 77 (skip) without a GPU or a CUDA build.
set -euo pipefail
TETRA=${1:?usage: gpu_fp8.sh /path/to/tetra}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

source "$(dirname "$0")/need_gpus.bash"
need_gpus "$TETRA" 1

run() {   # run DEVICE PRECISION NAME [--set k=v ...]
  "$TETRA" run "$ROOT/tools/bench/gpu_train.lua" --set train.device="$1" \
    --set train.precision="$2" --set data.mock=false --set data.input_path="$ROOT/README.md" \
    --set train.steps=50 --set log.metrics_file="$WORK/$3.jsonl" "${@:4}" |
    tee "$WORK/$3.out" | tail -1
}
# The FP8 run ends with a sample: its windows of 5 to 24 tokens are padded to multiples of
# 16 for the FP8 GEMMs, and an inference forward records no amax.
run cuda fp8 gpu_fp8 --set train.sample_tokens=20 --set train.temperature=0 --set train.prompt=Tetra
grep -q '^--- sample (20 tokens' "$WORK/gpu_fp8.out" ||
  { echo "FAIL: the FP8 run printed no sample"; exit 1; }
run cuda bf16 gpu_bf16
run cpu fp8 cpu_fp8

loss() { sed -E 's/.*"loss": ([-0-9.eE+]+).*/\1/' "$1"; }
paste <(loss "$WORK/gpu_fp8.jsonl") <(loss "$WORK/cpu_fp8.jsonl") <(loss "$WORK/gpu_bf16.jsonl") | awk '
  function abs(x) { return x < 0 ? -x : x }
  { e = abs($1 - $2); b = abs($1 - $3)
    if (NR <= 10) { if (e > we) we = e; if (b > wb) wb = b }
    if (NR > 40) { m1 += $1 / 10; m2 += $2 / 10; m3 += $3 / 10 }
    if (NR == 1) first = $1; last = $1
    printf "step %2d  cuda fp8 %.5f  cpu fp8 %.5f  cuda bf16 %.5f\n", NR, $1, $2, $3 }
  END {
    if (NR != 50) { print "FAIL: " NR " steps, expected 50"; exit 1 }
    if (first - last < 1.0) { printf "FAIL: the FP8 loss fell only %.3f\n", first - last; exit 1 }
    if (we > 5e-3) { printf "FAIL: steps 1-10: cuda fp8 vs cpu fp8 up to %.5f > 5e-3\n", we; exit 1 }
    if (wb > 5e-3) { printf "FAIL: steps 1-10: cuda fp8 vs cuda bf16 up to %.5f > 5e-3\n", wb; exit 1 }
    me = abs(m1 - m2); mb = abs(m1 - m3)
    if (me > 2e-2) { printf "FAIL: steps 41-50: mean cuda fp8 %.5f vs cpu fp8 %.5f\n", m1, m2; exit 1 }
    if (mb > 3e-2) { printf "FAIL: steps 41-50: mean cuda fp8 %.5f vs cuda bf16 %.5f\n", m1, m3; exit 1 }
    printf "PASS: steps 1-10 fp8 gpu vs cpu %.5f, fp8 vs bf16 %.5f (<= 5e-3); steps 41-50 means %.5f, %.5f\n",
           we, wb, me, mb }'
