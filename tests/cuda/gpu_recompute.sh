#!/usr/bin/env bash
# tests/cuda/gpu_recompute.sh TETRA — activation recompute on a GPU: the recipes' Llama
# (tools/bench/gpu_train.lua) trained 10 steps in bf16, fp8 and fp32 on cuda:0 with
# train.recompute none, selective (the re-run takes back the GEMM outputs kept by
# engine/cuda/matmul_lowp.cu, engine/cuda/fp8_linear.cu and engine/ops/matmul.c; an FP8
# layer's re-run quantises with its first run's scales) and full: every step's loss and
# gradient norm of each mode equal the no-recompute run's (the same kernels on the same
# inputs in the same order; 1e-6 allowed for a kernel that sums in another order on a
# second run), and selective's step peak lies between none's and full's. Exit 77 (skip)
# without a GPU or a CUDA build.
set -euo pipefail
TETRA=${1:?usage: gpu_recompute.sh /path/to/tetra}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

source "$(dirname "$0")/need_gpus.bash"
need_gpus "$TETRA" 1

fails=0
for precision in bf16 fp8 fp32; do
  for mode in none selective full; do
    "$TETRA" run "$ROOT/tools/bench/gpu_train.lua" --set train.device=cuda \
      --set train.precision="$precision" --set train.recompute="$mode" --set train.steps=10 \
      --set log.metrics_file="$WORK/$precision-$mode.jsonl" >"$WORK/$precision-$mode.log" 2>&1 ||
      { echo "FAIL: $precision $mode did not run:"; tail -n 5 "$WORK/$precision-$mode.log"; fails=1; }
  done
  python3 - "$WORK" "$precision" <<'PY' || fails=1
import json, sys
d, p = sys.argv[1], sys.argv[2]
runs = {m: [json.loads(l) for l in open(f"{d}/{p}-{m}.jsonl") if '"loss"' in l]
        for m in ("none", "selective", "full")}
bad = 0
for m in ("selective", "full"):
    for a, b in zip(runs["none"], runs[m]):
        for k in ("loss", "grad_norm"):
            if abs(a[k] - b[k]) > 1e-6 * max(1.0, abs(a[k])):
                print(f"FAIL: {p} {m} step {a['step']} {k} {b[k]} against {a[k]}"); bad = 1
    if len(runs[m]) != 10:
        print(f"FAIL: {p} {m}: {len(runs[m])} steps"); bad = 1
peak = {m: max(r.get("step_peak_bytes", 0) for r in runs[m]) for m in runs}
print(f"{p}: step peak none {peak['none']}, selective {peak['selective']}, full {peak['full']}")
if not peak["full"] < peak["selective"] < peak["none"]:
    print(f"FAIL: {p}: selective's step peak is not between full's and none's"); bad = 1
sys.exit(bad)
PY
done
[ $fails -eq 0 ] && echo PASS
exit $fails
