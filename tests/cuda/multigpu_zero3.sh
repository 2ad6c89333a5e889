#!/usr/bin/env bash
# tests/cuda/multigpu_zero3.sh TETRA — ZeRO-3 on GPUs: the tiny Llama (8 layers) on 2
# ranks, one GPU each, data parallel 2, bf16, 6 steps, with parallel.zero_stage 2 and 3.
# On the CPU tests/dist/zero3.sh holds ZeRO-3 to ZeRO-2 bit for bit; here the gathers go
# through NCCL on the device, the parameters' device memory is given back to the caching
# allocator between a block's uses (tt_storage_evict) and taken again, and the bf16
# copies are cast again on the device: every step's loss and gradient norm must equal
# ZeRO-2's (the same kernels on the same values), and rank 0's step peak must be lower.
# Exit 77 (skip) without a CUDA build with NCCL, mpirun, or two GPUs.
set -euo pipefail
TETRA=${1:?usage: multigpu_zero3.sh /path/to/tetra}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
command -v mpirun > /dev/null || { echo "SKIP: no mpirun"; exit 77; }
source "$(dirname "$0")/need_gpus.bash"
need_gpus "$TETRA" 2

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fails=0
for z in 2 3; do
  timeout -k 10 300 mpirun -np 2 "$TETRA" run "$ROOT/recipes/tiny.lua" --set train.device=cuda \
    --set train.precision=bf16 --set train.steps=6 --set train.warmup_steps=2 \
    --set model.n_layers=8 --set parallel.data_parallel_size=2 --set parallel.zero_stage=$z \
    --set log.metrics_file="$WORK/z$z.jsonl" >"$WORK/z$z.log" 2>&1 ||
    { echo "FAIL: zero_stage=$z did not run:"; tail -n 20 "$WORK/z$z.log"; fails=1; }
done
[ $fails -eq 0 ] || exit 1
python3 - "$WORK" <<'PY'
import json, sys
d = sys.argv[1]
runs = {z: [json.loads(l) for l in open(f"{d}/z{z}.jsonl") if '"loss"' in l] for z in (2, 3)}
bad = 0
if len(runs[2]) != 6 or len(runs[3]) != 6:
    print(f"FAIL: {len(runs[2])} and {len(runs[3])} steps, want 6"); bad = 1
for a, b in zip(runs[2], runs[3]):
    for k in ("loss", "grad_norm"):
        if a[k] != b[k]:
            print(f"FAIL: step {a['step']} {k}: ZeRO-3 {b[k]} against ZeRO-2 {a[k]}"); bad = 1
peak = {z: max(r["step_peak_bytes"] for r in runs[z]) for z in runs}
print(f"step peak on rank 0: ZeRO-2 {peak[2]} bytes, ZeRO-3 {peak[3]} bytes")
if not peak[3] < peak[2]:
    print("FAIL: ZeRO-3's step peak is not below ZeRO-2's"); bad = 1
print("PASS" if not bad else "FAIL")
sys.exit(bad)
PY
