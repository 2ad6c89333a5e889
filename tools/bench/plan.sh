#!/usr/bin/env bash
# tetra plan against measurement on this machine: 17 layouts of the small Llama of
# tools/bench/layouts.sh (dim 256, 4 layers, 8 heads / 4 KV heads, ffn 768, vocab 4096,
# seq 128, batch 8) on 1 or 2 ranks, one core each, run by `tetra sweep` beside the
# planner's prediction. Calibration, from measurements taken here and now:
#   links       an all-reduce of 4 KiB .. 16 MiB between 2 ranks (tools/bench/plan_comm.lua):
#               latency from the smallest, bandwidth from the two largest
#   sync wait   what each extra blocking collective between GEMMs costs in waiting for
#               the other rank (plan_comm.lua's segments synced each against once), as a
#               share of the GEMM time: tensor and context parallelism sync every block
#   sustained   the first layout of each rank count (one process; dp 2) sets the cpu
#               cluster's sustained fraction for that many ranks (tetra sweep
#               --calibrate: a shared machine gives 2 ranks less than 2 cores); every
#               other row is a prediction
#   rounds      the 19 layouts run --repeat times (default 3), one after the other in
#               each round, and every figure is the median of its rounds, so that a
#               change in the load of a shared machine falls on every layout alike and
#               the calibration rows are measured under the same loads as the rest
# Prints a Markdown table (the one in docs/planner.md): measured and predicted tokens/s,
# rank 0's allocator peak, exposed communication (bubble included), the errors, and how
# many rows are within 10% (memory) and 25% (time), and whether the ranking by tokens/s
# agrees (Spearman's rank correlation).
#   tools/bench/plan.sh [--tetra PATH] [--steps N] [--repeat N] [--keep DIR]
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
tetra="$root/build/tetra" steps=8 repeat=3 keep=""
die() { echo "plan.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --tetra) [ $# -ge 2 ] || die "--tetra needs a path"; tetra="$2"; shift 2 ;;
    --steps) [ $# -ge 2 ] || die "--steps needs a number"; steps="$2"; shift 2 ;;
    --repeat) [ $# -ge 2 ] || die "--repeat needs a number"; repeat="$2"; shift 2 ;;
    --keep) [ $# -ge 2 ] || die "--keep needs a directory"; keep="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case "$steps" in ''|*[!0-9]*) die "--steps must be a whole number" ;; esac
case "$repeat" in ''|*[!0-9]*|0) die "--repeat must be a whole number above 0" ;; esac
[ -x "$tetra" ] || die "no tetra executable at $tetra (build it: cmake --build build)"
command -v mpirun >/dev/null || die "mpirun not found"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d "${TMPDIR:-/tmp}/tetra-plan.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "# tetra plan vs measured  $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null)"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores (other jobs skew the times)"

OMP_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -np 2 "$tetra" run \
  "$root/tools/bench/plan_comm.lua" >"$work/comm.txt" 2>&1 || { cat "$work/comm.txt"; die "the all-reduce calibration failed"; }
read -r lat_us bw_gbs < <(awk '/^allreduce/ { n++; b[n] = $2; t[n] = $3 }
  END { printf "%.1f %.3f\n", 1e6 * t[1], (b[n] - b[1]) / (t[n] - t[1]) / 1e9 }' "$work/comm.txt")
echo "# all-reduce between 2 ranks: $(awk '/^allreduce/ { printf "%s B %.0f us; ", $2, 1e6 * $3 }' "$work/comm.txt")"
echo "# links: latency ${lat_us} us, bandwidth ${bw_gbs} GB/s"
read -r sync_wait < <(awk '/^sync/ { printf "%.4f\n", $3 / $2 }' "$work/comm.txt")
echo "# a blocking all-reduce after $(awk '/^sync/ { printf "%.1f ms", 1e3 * $2 }' "$work/comm.txt") of GEMM waits $(awk '/^sync/ { printf "%.2f ms", 1e3 * $3 }' "$work/comm.txt") more than one after the whole run of them: sync wait ${sync_wait}"

model=(--set model.dim=256 --set model.n_layers=4 --set model.n_heads=8 --set model.n_kv_heads=4
       --set model.ffn_hidden=768 --set model.vocab_size=4096 --set model.seq_len=128 --batch 8)
layouts=(dp=1,mb=4 dp=1,mb=8 dp=2,mb=2 dp=2,mb=4 dp=2,zero=1,mb=2 tp=2,mb=4 tp=2,sp=1,mb=4
         tp=2,mb=8 pp=2,mb=4 pp=2,mb=2,schedule=gpipe pp=2,mb=1
         pp=2,mb=2,schedule=interleaved_1f1b,v=2 cp=2,mb=4
         dp=1,mb=4,rc=selective dp=1,mb=4,rc=full dp=2,zero=2,mb=2 dp=2,zero=2,mb=2,rc=selective
         dp=2,zero=3,mb=2 dp=2,zero=3,mb=2,rc=full)
args=()
for l in "${layouts[@]}"; do args+=(--layout "$l"); done
[ -n "$keep" ] && args+=(--keep "$keep")
"$tetra" sweep "${model[@]}" --steps "$steps" --repeat "$repeat" --calibrate --json --intra-gbs "$bw_gbs" \
  --inter-gbs "$bw_gbs" --latency-us "$lat_us" --sync-wait "$sync_wait" "${args[@]}" >"$work/sweep.json" 2>"$work/sweep.err"
rc=$?
grep '^# calibrated' "$work/sweep.err"
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$work/sweep.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
def name(r):
    s = f"dp{r['dp']} tp{r['tp']} pp{r['pp']} cp{r['cp']}"
    if r["zero_stage"]: s += f" ZeRO-{r['zero_stage']}"
    if r["sequence_parallel"]: s += " SP"
    s += f", mb {r['micro_batch']}"
    if r["pp"] > 1: s += f", {r['schedule']}"
    if r.get("recompute", "none") != "none": s += f", {r['recompute']} recompute"
    return s
print("| layout | ranks | tokens/s measured | predicted | error | peak MiB measured | predicted | error | exposed comm ms measured | predicted | step ms, each round |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
ok_mem = ok_time = n = 0
meas, pred = [], []
for i, r in enumerate(rows):
    if r.get("failed"):
        print(f"| {name(r)} | {r['world']} | FAILED | | | | | | | | |"); continue
    n += 1
    et = r["predicted_tokens_per_s"] / r["measured_tokens_per_s"] - 1
    em = r["predicted_peak_bytes"] / r["measured_peak_bytes"] - 1
    cal = r.get("calibration")
    ok_mem += abs(em) <= 0.10
    ok_time += abs(et) <= 0.25 if not cal else 0
    if not cal: meas.append(r["measured_tokens_per_s"]); pred.append(r["predicted_tokens_per_s"])
    tag = " (calibration)" if cal else ""
    print(f"| {name(r)}{tag} | {r['world']} | {r['measured_tokens_per_s']:.0f} | {r['predicted_tokens_per_s']:.0f} | {100*et:+.0f}% "
          f"| {r['measured_peak_bytes']/2**20:.1f} | {r['predicted_peak_bytes']/2**20:.1f} | {100*em:+.1f}% "
          f"| {1000*r['measured_exposed_comm_s']:.1f} | {1000*r['predicted_exposed_comm_s']:.1f} "
          f"| {' '.join(f'{1000 * x:.0f}' for x in r['measured_step_s_runs'])} |")
def ranks(xs):
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    rk = [0] * len(xs)
    for pos, i in enumerate(order): rk[i] = pos
    return rk
if len(meas) > 2:
    a, b = ranks(meas), ranks(pred)
    m = len(a)
    rho = 1 - 6 * sum((x - y) ** 2 for x, y in zip(a, b)) / (m * (m * m - 1))
else:
    rho = float("nan")
print()
print(f"memory within 10%: {ok_mem} of {n}; tokens/s within 25%: {ok_time} of {len(meas)} predicted rows; "
      f"rank correlation of tokens/s (Spearman, predicted rows): {rho:.2f}")
EOF
exit $rc
