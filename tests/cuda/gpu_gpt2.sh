#!/usr/bin/env bash
# tests/cuda/gpu_gpt2.sh TETRA — GPT-2 (learned positions, LayerNorm and linears with
# biases, tied head; the tiny shape of tests/dist/layouts.txt) trained for 12 steps on
# cuda:0 in bf16 follows the fp32 CPU loss curve within 3e-2, and its eval losses (every
# 4 steps) are finite and within 3e-2 of the CPU's. A desk review found both broken on
# GPUs: the position ids were made on the CPU (wpe's table is on the GPU: "tensors on
# different devices"), and F.item read any GPU tensor as NaN (every eval loss). Exit 77
# (skip) without a GPU or a CUDA build.
set -euo pipefail
TETRA=${1:?usage: gpu_gpt2.sh /path/to/tetra}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

source "$(dirname "$0")/need_gpus.bash"
need_gpus "$TETRA" 1 tt_cuda_linear_lowp

run() {   # run DEVICE PRECISION OUT
  "$TETRA" run "$ROOT/recipes/gpt2.lua" --set train.device="$1" --set train.precision="$2" \
    --set model.vocab_size=256 --set model.dim=64 --set model.n_layers=2 \
    --set model.n_heads=4 --set model.ffn_hidden=128 --set model.seq_len=32 \
    --set train.steps=12 --set train.lr=3e-3 --set train.warmup_steps=2 \
    --set train.eval_every=4 --set log.progress=false --set log.metrics_file="$3"
}
run cpu fp32 "$WORK/cpu.jsonl"
run cuda bf16 "$WORK/gpu.jsonl"

field() { grep -oE "\"$1\": *[^,}]+" "$2" | sed -E 's/.*: *//'; }
paste <(field loss "$WORK/cpu.jsonl") <(field loss "$WORK/gpu.jsonl") | awk '
  { d = $1 - $2; if (d < 0) d = -d; if (d > worst) worst = d
    if ($2 ~ /[nN][aA][nN]|[iI][nN][fF]|null/) worst = "not finite"
    printf "step %2d  cpu fp32 %.5f  cuda bf16 %.5f  |diff| %.5f\n", NR, $1, $2, d }
  END {
    if (NR != 12) { print "FAIL: " NR " steps, expected 12"; exit 1 }
    if (worst == "not finite" || worst > 3e-2) { print "FAIL: a GPU loss is " \
      (worst == "not finite" ? "not finite" : "more than 3e-2 from the CPU'"'"'s"); exit 1 }
    printf "PASS: losses within %.5f\n", worst }'
paste <(field eval_loss "$WORK/cpu.jsonl") <(field eval_loss "$WORK/gpu.jsonl") | awk '
  { d = $1 - $2; if (d < 0) d = -d; if (d > 3e-2 || $2 ~ /[nN][aA][nN]|[iI][nN][fF]|null/) bad = 1
    printf "eval  cpu %s  cuda %s\n", $1, $2 }
  END {
    if (NR != 3) { print "FAIL: " NR " eval losses, expected 3"; exit 1 }
    if (bad) { print "FAIL: an eval loss on the GPU is not finite or not within 3e-2"; exit 1 }
    print "PASS: eval losses finite and within 3e-2" }'
