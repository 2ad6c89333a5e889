#!/usr/bin/env bash
# tests/cuda/multigpu_offload_zero.sh TETRA — optimizer offload under ZeRO-2 on GPUs: the
# tiny Llama (8 layers) on 2 ranks, one GPU each, data parallel 2, bf16, 8 steps, with and
# without parallel.offload_optimizer. With it each rank keeps its shares of the moments
# and of the GEMM-only weights' f32 masters in page-locked host memory, the whole f32
# weights leave the device from the forward to the update (AdamW:masters_on_host with
# ddp:master_shares), and the shares come back through the reducer's NCCL all-gather.
# On the CPU tests/dist/offload_zero.sh holds this to the run without offload bit for
# bit; here the update is the CPU kernel's where the other run's is the CUDA kernel's,
# so each step's loss and gradient norm must agree within 2e-3 relative (as
# cuda/gpu_offload's bf16 bound: a one-ulp difference of an f32 master can move its bf16
# copy a bf16 ulp), and from step 3 rank 0's peak must be lower by the moments and about
# the whole masters besides. Exit 77 (skip) without a CUDA build with NCCL, mpirun, or
# two GPUs.
set -euo pipefail
TETRA=${1:?usage: multigpu_offload_zero.sh /path/to/tetra}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
command -v mpirun > /dev/null || { echo "SKIP: no mpirun"; exit 77; }
source "$(dirname "$0")/need_gpus.bash"
need_gpus "$TETRA" 2

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fails=0
for off in false true; do
  timeout 300 mpirun -np 2 "$TETRA" run "$ROOT/recipes/tiny.lua" --set train.device=cuda \
    --set train.precision=bf16 --set train.steps=8 --set train.warmup_steps=2 \
    --set model.n_layers=8 --set parallel.data_parallel_size=2 --set parallel.zero_stage=2 \
    --set parallel.offload_optimizer=$off --set log.progress=false \
    --set log.metrics_file="$WORK/$off.jsonl" >"$WORK/$off.log" 2>&1 ||
    { echo "FAIL: offload_optimizer=$off did not run:"; tail -n 20 "$WORK/$off.log"; fails=1; }
done
[ $fails -eq 0 ] || exit 1
grep -m1 '^memory' "$WORK/true.log" || true
python3 - "$WORK" <<'PY'
import json, sys
d = sys.argv[1]
runs = {o: [json.loads(l) for l in open(f"{d}/{o}.jsonl") if '"loss"' in l]
        for o in ("false", "true")}
bad = 0
if len(runs["false"]) != 8 or len(runs["true"]) != 8:
    print(f"FAIL: {len(runs['false'])} and {len(runs['true'])} steps, want 8"); bad = 1
worst = 0.0
for a, b in zip(runs["false"], runs["true"]):
    for k in ("loss", "grad_norm"):
        rel = abs(a[k] - b[k]) / max(1e-12, abs(a[k]))
        worst = max(worst, rel)
        if not rel <= 2e-3:
            print(f"FAIL: step {a['step']} {k}: offloaded {b[k]}, on the GPU {a[k]}"); bad = 1
last = runs["true"][-1]
host, released = last.get("host_master_bytes") or 0, last.get("released_master_bytes") or 0
dev_opt = runs["false"][-1].get("optimizer_bytes", 0)
pk = {o: max(r.get("peak_bytes", 0) for r in runs[o][2:]) for o in runs}
print(f"worst relative difference {worst:.2e}; rank 0's master shares on the host {host} "
      f"bytes, whole masters off the device {released}; peak from step 3 {pk['false']} "
      f"without offload, {pk['true']} with; moments {dev_opt}")
if not (0 < host < released):
    print("FAIL: rank 0 does not keep a share of the masters on the host"); bad = 1
if dev_opt <= 0 or pk["false"] - pk["true"] < dev_opt + 0.9 * released:
    print("FAIL: the moments and masters did not leave the device's peak"); bad = 1
print("PASS" if not bad else "FAIL")
sys.exit(bad)
PY
