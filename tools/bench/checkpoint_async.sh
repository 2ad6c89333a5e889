#!/usr/bin/env bash
# The step-time cost of checkpoints, synchronous and asynchronous (checkpoint.async),
# at checkpoint.every=10 on a small Llama (3.3M parameters: dim 256, 4 layers; a
# checkpoint of 40 MB with the AdamW moments), one process.
# Usage: tools/bench/checkpoint_async.sh [path/to/tetra] [steps (60)] [repeats (3)]
# Prints, per mode, the median over the repeats of the training loop's wall time per
# step (the "done:" line: steps and saves, not start-up), and the cost against no
# checkpoints.
set -eu
tetra="${1:-build/tetra}"
steps="${2:-60}"
repeats="${3:-3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
model=(--set model.dim=256 --set model.n_layers=4 --set model.n_heads=4 --set model.n_kv_heads=2
       --set model.ffn_hidden=768 --set train.steps="$steps" --set log.progress=true
       --set log.every=1000)
per_step() {   # mode -> median seconds per step
  local mode="$1" i out times=()
  for ((i = 0; i < repeats; i++)); do
    rm -rf "$work/ck"
    case "$mode" in
      none) extra=() ;;
      sync) extra=(--set checkpoint.dir="$work/ck" --set checkpoint.every=10) ;;
      async) extra=(--set checkpoint.dir="$work/ck" --set checkpoint.every=10 --set checkpoint.async=true) ;;
    esac
    out=$("$tetra" run recipes/tiny.lua "${model[@]}" "${extra[@]}" | grep "^done:")
    times+=("$(echo "$out" | sed -n 's/^done: \([0-9]*\) steps in \([0-9.]*\) s.*/\2/p')")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk -v n="$steps" '{ t[NR] = $1 } END { printf "%.6f", t[int((NR + 1) / 2)] / n }'
}
none=$(per_step none)
sync=$(per_step sync)
async=$(per_step async)
awk -v a="$none" -v s="$sync" -v y="$async" 'BEGIN {
  printf "no checkpoints        %7.2f ms/step\n", a * 1000
  printf "sync, every 10 steps  %7.2f ms/step  (+%.1f%%)\n", s * 1000, (s - a) / a * 100
  printf "async, every 10 steps %7.2f ms/step  (+%.1f%%)\n", y * 1000, (y - a) / a * 100 }'
