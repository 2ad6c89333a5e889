#!/usr/bin/env bash
# The step-time cost of checkpoints, synchronous and asynchronous (checkpoint.async),
# at checkpoint.every=10 on a tiny Llama (recipes/tiny.lua with dim 128 and 4 layers:
# 0.8M parameters, a 10 MB checkpoint with the AdamW moments), one process, one thread.
# Usage: tools/bench/checkpoint_async.sh [path/to/tetra] [steps (200)] [repeats (3)]
# Each repeat runs the three modes back to back. From the metrics records, per mode:
# the median step time (step_time_s: forward, backward, optimizer) and the time the
# training loop spent on checkpoints between steps (checkpoint_s: the whole save when
# synchronous; the host copy and the publishing rename when asynchronous), per step,
# as a share of the median step of the run without checkpoints. The last step's save
# (synchronous in both modes) is not in any record.
set -eu
tetra="${1:-build/tetra}"
steps="${2:-200}"
repeats="${3:-3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
model=(--set model.dim=128 --set model.n_layers=4 --set model.ffn_hidden=384
       --set train.steps="$steps" --set log.progress=false)
for ((i = 0; i < repeats; i++)); do
  for mode in none sync async; do
    rm -rf "$work/ck"
    case "$mode" in
      none) extra=() ;;
      sync) extra=(--set checkpoint.dir="$work/ck" --set checkpoint.every=10) ;;
      async) extra=(--set checkpoint.dir="$work/ck" --set checkpoint.every=10 --set checkpoint.async=true) ;;
    esac
    "$tetra" run recipes/tiny.lua "${model[@]}" "${extra[@]}" \
      --set log.metrics_file="$work/$mode.$i.jsonl" >/dev/null
  done
done
python3 - "$work" "$repeats" <<'PY'
import json, statistics, sys
work, repeats = sys.argv[1], int(sys.argv[2])
def runs(mode):
    return [[json.loads(l) for l in open(f"{work}/{mode}.{i}.jsonl")] for i in range(repeats)]
base = statistics.median(r["step_time_s"] for run in runs("none") for r in run[5:])
print(f"median step without checkpoints: {base * 1e3:.2f} ms")
for mode in ("sync", "async"):
    rs = runs(mode)
    step = statistics.median(r["step_time_s"] for run in rs for r in run[5:])
    # Per repeat: checkpoint seconds per step; the median repeat.
    per_step = statistics.median(sum(r["checkpoint_s"] for r in run) / len(run) for run in rs)
    print(f"{mode:5s}, every 10 steps: median step {step * 1e3:.2f} ms, checkpoint time "
          f"{per_step * 1e3:.2f} ms per step = {per_step / base * 100:.1f}% of a step")
PY
