#!/usr/bin/env bash
# The step-time cost of checkpoints, synchronous and asynchronous (checkpoint.async),
# at checkpoint.every=10 on a tiny Llama (recipes/tiny.lua with dim 128 and 4 layers:
# 0.8M parameters, a 10 MB checkpoint with the AdamW moments), one process.
# Usage: tools/bench/checkpoint_async.sh [path/to/tetra] [steps (200)] [repeats (5)]
# Each repeat runs the three modes back to back (so that a busy machine slows them
# alike); per mode it prints the median over the repeats of the training loop's wall
# time per step (the "done:" line: steps and saves, not start-up) and the cost against
# no checkpoints.
set -eu
tetra="${1:-build/tetra}"
steps="${2:-200}"
repeats="${3:-5}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
model=(--set model.dim=128 --set model.n_layers=4 --set model.ffn_hidden=384
       --set train.steps="$steps" --set log.progress=true --set log.every=100000)
run_once() {   # mode -> seconds of the training loop
  local extra=()
  rm -rf "$work/ck"
  case "$1" in
    sync) extra=(--set checkpoint.dir="$work/ck" --set checkpoint.every=10) ;;
    async) extra=(--set checkpoint.dir="$work/ck" --set checkpoint.every=10 --set checkpoint.async=true) ;;
  esac
  "$tetra" run recipes/tiny.lua "${model[@]}" "${extra[@]}" |
    sed -n 's/^done: [0-9]* steps in \([0-9.]*\) s.*/\1/p'
}
for ((i = 0; i < repeats; i++)); do
  for mode in none sync async; do echo "$mode $(run_once $mode)"; done
done >"$work/times"
median() { awk -v m="$1" '$1 == m { print $2 }' "$work/times" | sort -g |
           awk -v n="$steps" '{ t[NR] = $1 } END { printf "%.6f", t[int((NR + 1) / 2)] / n }'; }
none=$(median none); sync=$(median sync); async=$(median async)
awk -v a="$none" -v s="$sync" -v y="$async" 'BEGIN {
  printf "no checkpoints         %7.2f ms/step\n", a * 1000
  printf "sync, every 10 steps   %7.2f ms/step  (%+.1f%%)\n", s * 1000, (s - a) / a * 100
  printf "async, every 10 steps  %7.2f ms/step  (%+.1f%%)\n", y * 1000, (y - a) / a * 100 }'
