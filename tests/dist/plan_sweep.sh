#!/usr/bin/env bash
# tetra plan against measurement, the small version of tools/bench/plan.sh: `tetra sweep`
# runs 9 layouts of a small Llama (dim 128, 2 layers, vocab 2048, seq 64, batch 8) for 5
# steps each (1 process, then dp 2 with micro-batches of 2 and 4, dp 2 + ZeRO-1 and
# ZeRO-2, tp 2 with and without sequence parallelism, pp 2 under 1F1B, cp 2), calibrated on
# the first layout of each rank count (one process, dp 2: the machine's speed now) and on an
# all-reduce between 2 ranks measured just before (the links' speed now),
# and every row must be predicted within:
#   memory     rank 0's allocator peak (peak_bytes; deterministic): within 3% without
#              pipeline parallelism (5% with ZeRO-1 and 2, whose shard gradients land during
#              backward, which the accounting does not follow yet; with tensor-parallel
#              slices kept as views of the whole matrices the peak was 8% above the
#              prediction), 10% with it (the peak of a pipeline stage comes out 4-9% off,
#              docs/planner.md)
#   step time  a factor of 5: on this shared machine ranks wait for cores other jobs
#              hold, and every blocking collective pays for it, which no layout model
#              sees (at a load average of 10-15 on 2 cores, tp 2 measured 2-5x slower
#              than predicted); when a row misses, the sweep runs once more and each
#              row must be within the factor in one of the two. tools/bench/plan.sh is
#              the 25% comparison; docs/planner.md shows its table and the load it ran under
# Also: bad input to plan and sweep is one line and exit 2, and --write gives a YAML that
# `tetra run` accepts as the predicted layout.
# Usage: bash plan_sweep.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
status=0
fail() { echo "FAIL: $*"; status=1; }

model=(--set model.dim=128 --set model.n_layers=2 --set model.n_heads=4 --set model.n_kv_heads=2
       --set model.ffn_hidden=384 --set model.vocab_size=2048 --set model.seq_len=64 --batch 8)
# The links as they are now (tools/bench/plan_comm.lua, as tools/bench/plan.sh does).
mpirun --oversubscribe --bind-to none -np 2 "$tetra" run "$root/tools/bench/plan_comm.lua" \
  >"$work/comm.txt" 2>&1 || { fail "the all-reduce calibration failed"; cat "$work/comm.txt"; exit 1; }
read -r lat_us bw_gbs < <(awk '/^allreduce/ { n++; b[n] = $2; t[n] = $3 }
  END { printf "%.1f %.3f\n", 1e6 * t[1], (b[n] - b[1]) / (t[n] - t[1]) / 1e9 }' "$work/comm.txt")
echo "links now: ${lat_us} us, ${bw_gbs} GB/s; load average $(cut -d' ' -f1-3 /proc/loadavg)"
# The bandwidth is the slope between the smallest and the largest all-reduce (4 KB, 16 MB):
# between the two largest, a loaded machine once gave a negative one.
if ! awk -v b="$bw_gbs" 'BEGIN { exit !(b > 0) }'; then
  fail "the all-reduce calibration gave no positive bandwidth:"; cat "$work/comm.txt"; exit 1
fi
# One sweep into $work/sweep$1.json.
sweep() {
  timeout -k 10 300 "$tetra" sweep "${model[@]}" --steps 5 --json --calibrate \
    --intra-gbs "$bw_gbs" --latency-us "$lat_us" \
    --layout dp=1,mb=4 --layout dp=2,mb=2 --layout tp=2,mb=8 --layout tp=2,sp=1,mb=8 \
    --layout pp=2,mb=2 --layout cp=2,mb=4 --layout dp=2,mb=4 --layout dp=2,zero=1,mb=2 \
    --layout dp=2,zero=2,mb=2 --layout dp=2,mb=2,rc=full \
    >"$work/sweep$1.json" 2>"$work/sweep.err" && return 0
  fail "tetra sweep failed:"; cat "$work/sweep.err"; exit 1
}
# The rows against the bounds. With two files (a second sweep) a row's step time passes if
# either run was within bounds. Exit 0: all pass; 3: only step times missed; 1: otherwise.
judge() {
  python3 - "$@" <<'EOF'
import json, sys
runs = [json.load(open(f)) for f in sys.argv[1:]]
for rows in runs:
    assert len(rows) == 10, f"{len(rows)} rows"
bad = slow = 0
for i, r in enumerate(runs[0]):
    mem = r["predicted_peak_bytes"] / r["measured_peak_bytes"] - 1
    ts = [rows[i]["predicted_step_s"] / rows[i]["measured_step_s"] for rows in runs]
    # ZeRO-1: 5%. Since the reducer lands each bucket's shard gradients during backward
    # its peak is 0.4 MiB (2%) lower than the planner's accounting has it (+3.9% measured).
    # ZeRO-2 (whole gradients released as their buckets fill, not followed either): -3.8%.
    # Activation recompute (the block's input kept, its forward rerun in backward): 10%.
    rc = r.get("recompute", "none") != "none"
    lim = 0.10 if r["pp"] > 1 or rc else (0.05 if r["zero_stage"] >= 1 else 0.03)
    mem_ok = abs(mem) <= lim
    t_ok = any(0.2 <= t <= 5.0 for t in ts)
    times = " / ".join(f"x{t:5.2f}" for t in ts)
    print(f"{r['name']:36s} memory {100 * mem:+6.2f}%  step time {times}  "
          f"{'ok' if mem_ok and t_ok else 'FAIL'}")
    bad += not mem_ok
    slow += not t_ok
sys.exit(1 if bad else (3 if slow else 0))
EOF
}
sweep 1
judge "$work/sweep1.json"
rc=$?
# Memory is deterministic, a step time is not: load from outside this test (which runs
# alone under ctest, RUN_SERIAL) can slow one row past the factor; a pipeline row once
# measured 5.7x at a load average of 5.5. A second sweep decides, and a wrong cost model
# misses in both.
if [ $rc = 3 ]; then
  echo "a step time out of bounds (load average $(cut -d' ' -f1-3 /proc/loadavg)): once more"
  sweep 2
  judge "$work/sweep1.json" "$work/sweep2.json"
  rc=$?
fi
[ $rc = 0 ] || status=1

# Bad input: one line on stderr, exit 2.
for args in "--cluster nope" "--batch x" "--model nope" "--tp" "nofile.yaml" "--frobnicate"; do
  # shellcheck disable=SC2086
  "$tetra" plan $args >"$work/out" 2>"$work/err"
  rc=$?
  [ $rc = 2 ] || fail "tetra plan $args: exit $rc, want 2"
  [ "$(wc -l <"$work/err")" = 1 ] || { fail "tetra plan $args: not one line:"; cat "$work/err"; }
done
"$tetra" sweep --layout tp=x >"$work/out" 2>"$work/err"
[ $? = 2 ] && [ "$(wc -l <"$work/err")" = 1 ] || fail "tetra sweep --layout tp=x: not one line, exit 2"

# --write: the best 2-rank layout as YAML; tetra run trains it with that layout.
"$tetra" plan "${model[@]}" --write "$work/best.yaml" >"$work/plan.txt" || fail "tetra plan --write"
np=$(sed -n 's/^# run: mpirun -np \([0-9]*\).*/\1/p' "$work/best.yaml")
[ "$np" = 2 ] || fail "the YAML names $np ranks, want 2"
if ! timeout -k 10 120 mpirun --oversubscribe --bind-to none -np 2 "$tetra" run "$work/best.yaml" \
      --set train.steps=2 --set train.warmup_steps=1 --set log.progress=false \
      --set log.metrics_file="$work/best.jsonl" >"$work/best.log" 2>&1; then
  fail "tetra run of the planned YAML failed:"; tail -n 5 "$work/best.log"
fi
[ "$(grep -c '^{' "$work/best.jsonl" 2>/dev/null)" = 2 ] || fail "the planned run wrote no metrics"

[ $status = 0 ] && echo "plan_sweep: ok"
exit $status
