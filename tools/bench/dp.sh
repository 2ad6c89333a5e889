#!/usr/bin/env bash
# Data parallelism on this machine: the same global batch trained by one process (all
# cores) and by 2 DP ranks (half the cores each). Prints one JSON line per run from
# tools/bench/dp.lua: step time, tokens/s, and the share of gradient communication left
# exposed after overlapping it with backward. The 2-rank run is repeated ROUNDS times
# (default 5) with the first blocks' weight gradients deferred (dist.defer_weight_grads,
# the default) and without, the two in turns (which goes first alternates), and a last
# line compares them: the median exposed share of each, and the median of each round's
# step-time ratio (deferred / not), its two runs side by side in time.
#   [ROUNDS=N] tools/bench/dp.sh [path/to/tetra] [--set key=value ...]
set -eu
root="$(cd "$(dirname "$0")/../.." && pwd)"
tetra="${1:-$root/build/tetra}"
[ $# -gt 0 ] && shift
rounds="${ROUNDS:-5}"
cores=$(nproc)
half=$((cores / 2 > 0 ? cores / 2 : 1))
common=(--set train.steps=6 --set train.warmup_steps=1 --set train.batch_size=8 --set model.seq_len=128 "$@")
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset: passive, the tetra default}"
echo "# 1 process, OMP_NUM_THREADS=$cores"
OMP_NUM_THREADS=$cores "$tetra" run "$root/tools/bench/dp.lua" "${common[@]}" | grep '^{'
dp2() {
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=$half \
    "$tetra" run "$root/tools/bench/dp.lua" "${common[@]}" \
    --set parallel.data_parallel_size=2 --set dist.defer_weight_grads="$1" | grep '^{'
}
echo "# 2 ranks (data_parallel_size=2), OMP_NUM_THREADS=$half each; $rounds rounds of" \
     "deferred (true) and not (false)"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="true false"; else order="false true"; fi
  for d in $order; do echo "$r $d $(dp2 "$d")" | tee -a "$out"; done
done
python3 - "$out" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r, d, js = line.split(" ", 2)
    runs.setdefault(d, {})[int(r)] = json.loads(js)
on, off = runs["true"], runs["false"]
ratios = sorted(on[r]["step_time_s"] / off[r]["step_time_s"] for r in on if r in off)
def share(rs):
    xs = sorted(v["exposed_fraction"] for v in rs.values())
    return "%.1f%% (%.1f-%.1f%%)" % (100 * statistics.median(xs), 100 * xs[0], 100 * xs[-1])
print("exposed: deferred %s, not deferred %s; step time deferred / not: %.3f (%.3f-%.3f), "
      "%d rounds" % (share(on), share(off), statistics.median(ratios), ratios[0], ratios[-1],
                     len(ratios)))
PY
