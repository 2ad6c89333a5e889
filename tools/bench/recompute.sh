#!/usr/bin/env bash
# Activation recompute's trade on this machine: recipes/llama/model.lua (dim 256, 8
# layers, seq 256, batch 8 by default; --set overrides) trained for a few steps with
# train.recompute none, selective, full on every other block, and full on every block
# (ROUNDS=N in the environment: that many interleaved rounds of the four). Prints one
# line per mode: the allocator's peak during a step (peak_bytes: parameters, optimizer
# state, gradients and activations) and how far the step rose above what it started with
# (step_peak_bytes: activations and gradients), the last step's loss and grad norm (equal
# in every mode: recompute is bit-exact), and the median step time with its forward and
# backward parts (steps 2 on).
#   tools/bench/recompute.sh [path/to/tetra] [--set key=value ...]
set -eu
root="$(cd "$(dirname "$0")/../.." && pwd)"
tetra="${1:-$root/build/tetra}"
[ $# -gt 0 ] && shift
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(--set model.n_layers=8 --set train.steps=5 --set train.warmup_steps=1
        --set train.sample_tokens=0 --set log.progress=false "$@")
run() {   # name, then --set arguments
  local name="$1"; shift
  "$tetra" run "$root/recipes/llama/model.lua" "${common[@]}" "$@" \
    --set log.metrics_file="$out/$name.jsonl" > "$out/$name.log"
  python3 - "$name" "$out/$name.jsonl" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
steps = [r for r in recs if "step_peak_bytes" in r]
last = steps[-1]
med = lambda k: statistics.median([r[k] for r in steps[1:]] or [last[k]]) * 1000
mib = lambda k: max(r[k] for r in steps) / 2**20
print(f"{sys.argv[1]:<12} peak {mib('peak_bytes'):6.1f} MiB  step peak {mib('step_peak_bytes'):6.1f} MiB"
      f"  loss {last['loss']:.8f}  grad_norm {last['grad_norm']:.8f}"
      f"  step {med('step_time_s'):6.0f} ms (forward {med('forward_s'):5.0f}, backward {med('backward_s'):5.0f})")
PY
}
for ((r = 1; r <= ${ROUNDS:-1}; r++)); do
  [ "${ROUNDS:-1}" -gt 1 ] && echo "round $r"
  run none --set train.recompute=none
  run selective --set train.recompute=selective
  run full_every2 --set train.recompute=full --set train.recompute_every=2
  run full --set train.recompute=full
done
