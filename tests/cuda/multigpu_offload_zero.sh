#!/usr/bin/env bash
# tests/cuda/multigpu_offload_zero.sh TETRA — optimizer offload under ZeRO-2 and ZeRO-3 on
# GPUs: the tiny Llama (8 layers) on 2 ranks, one GPU each, data parallel 2, bf16, 8
# steps, with and without parallel.offload_optimizer. With it each rank keeps its shares
# of the moments and of the f32 masters in page-locked host memory (AdamW:masters_on_host
# with ddp:master_shares): under ZeRO-2 the whole GEMM-only f32 weights leave the device
# from the forward to the update and the shares come back through the reducer's NCCL
# all-gather; under ZeRO-3 the reducer's buffers of this rank's shares leave it, the
# blocks' gathers sending bf16 copies kept meanwhile.
# On the CPU tests/dist/offload_zero.sh holds this to the run without offload bit for
# bit; here the update is the CPU kernel's where the other run's is the CUDA kernel's,
# so each step's loss, and the gradient norm of the first 3 steps, must agree within 2e-3
# relative (as cuda/gpu_offload's bf16 bound: a one-ulp difference of an f32 master can
# move its bf16 copy a bf16 ulp), and from step 3 rank 0's peak must be lower by the
# moments and about the masters released besides. The later gradient norms are printed,
# not bounded: on mock tokens this bf16 model amplifies those ulps about tenfold a step
# (on the emulated device, tests/emu: 2e-5 at step 2, 1e-4 at 3, 1.7e-3 at 4, 2.8e-2 at 7,
# where the loss stayed within 3.5e-5 and fp32 runs within 3.3e-6 throughout).
# Exit 77 (skip) without a CUDA build with NCCL, mpirun, or two GPUs.
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
for zero in 2 3; do
  for off in false true; do
    run="z${zero}_$off"
    timeout -k 10 300 mpirun -np 2 "$TETRA" run "$ROOT/recipes/tiny.lua" --set train.device=cuda \
      --set train.precision=bf16 --set train.steps=8 --set train.warmup_steps=2 \
      --set model.n_layers=8 --set parallel.data_parallel_size=2 \
      --set parallel.zero_stage=$zero --set parallel.offload_optimizer=$off \
      --set log.progress=false --set log.metrics_file="$WORK/$run.jsonl" \
      >"$WORK/$run.log" 2>&1 ||
      { echo "FAIL: $run did not run:"; tail -n 20 "$WORK/$run.log"; fails=1; }
  done
  grep -m1 '^memory' "$WORK/z${zero}_true.log" || true
done
[ $fails -eq 0 ] || exit 1
python3 - "$WORK" <<'PY'
import json, sys
d = sys.argv[1]
bad = 0
for zero in (2, 3):
    runs = {o: [json.loads(l) for l in open(f"{d}/z{zero}_{o}.jsonl") if '"loss"' in l]
            for o in ("false", "true")}
    if len(runs["false"]) != 8 or len(runs["true"]) != 8:
        print(f"FAIL: ZeRO-{zero}: {len(runs['false'])} and {len(runs['true'])} steps, want 8")
        bad = 1
    worst = 0.0
    later = []
    for a, b in zip(runs["false"], runs["true"]):
        for k in ("loss", "grad_norm"):
            rel = abs(a[k] - b[k]) / max(1e-12, abs(a[k]))
            if k == "grad_norm" and a["step"] > 3:
                later.append(f"{rel:.1e}")
                continue
            worst = max(worst, rel)
            if not rel <= 2e-3:
                print(f"FAIL: ZeRO-{zero} step {a['step']} {k}: offloaded {b[k]}, on the GPU "
                      f"{a[k]}"); bad = 1
    print(f"ZeRO-{zero}: gradient norms' relative differences from step 4 (not bounded): "
          + " ".join(later))
    last = runs["true"][-1]
    host, released = last.get("host_master_bytes") or 0, last.get("released_master_bytes") or 0
    dev_opt = runs["false"][-1].get("optimizer_bytes", 0)
    pk = {o: max(r.get("peak_bytes", 0) for r in runs[o][2:]) for o in runs}
    print(f"ZeRO-{zero}: worst relative difference {worst:.2e}; rank 0's master shares on the "
          f"host {host} bytes, masters off the device {released}; peak from step 3 "
          f"{pk['false']} without offload, {pk['true']} with; moments {dev_opt}")
    # ZeRO-2 keeps a share of the whole weights it releases; ZeRO-3 every share, of which
    # the buffers less their bf16 copies leave the device.
    if not (0 < host < released if zero == 2 else 0 < released < host):
        print(f"FAIL: ZeRO-{zero}: rank 0's masters on the host do not add up"); bad = 1
    if dev_opt <= 0 or pk["false"] - pk["true"] < dev_opt + 0.9 * released:
        print(f"FAIL: ZeRO-{zero}: the moments and masters did not leave the device's peak")
        bad = 1
print("PASS" if not bad else "FAIL")
sys.exit(bad)
PY
