#!/usr/bin/env bash
# tetra launch finds a dead host itself and grows back when it returns, on a namespace
# cluster of 2 hosts x 2 slots (tools/cluster). The job asks for dp2 x tp2 (tensor
# parallelism inside each host) while node2's link is down: the supervisor, run on node1
# as on a cluster's first node, probes the hostfile's hosts through mpirun's rsh agent,
# leaves node2 out and starts dp1 x tp2 on node1. Once training runs, node2's link comes
# up; the supervisor sees it answer, waits for the job's next checkpoint, stops the job
# and resumes it as dp2 x tp2 on both hosts. The run finishes, and its records equal, bit
# for bit, a plain dp1 x tp2 run up to that checkpoint and a plain dp2 x tp2 run resumed
# from it after.
# Usage: bash cluster_elastic.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
source "$(dirname "$0")/cluster.bash"
cluster_up 2 2
py="${PYTHON:-python3}"
failed=0
fail() { echo "FAIL: $*"; failed=1; }
steps=400
job=(recipes/tiny.lua --set parallel.tensor_parallel_size=2 --set train.steps=$steps
     --set checkpoint.every=40 --set checkpoint.keep=0 --set log.every=100)

cluster link node2 down
on_head timeout -k 10 300 "$tetra" launch --min-np 2 --backoff 0.1 --probe-timeout 5 --grow-every 1 -- \
  mpirun -np 4 "${mpi_hosts[@]}" "$tetra" run "${job[@]}" \
  --set parallel.data_parallel_size=2 --set checkpoint.dir="$work/ck" \
  --set log.metrics_file="$work/elastic.jsonl" >"$work/elastic.out" 2>&1 &
launch=$!
started=$SECONDS
for i in $(seq 1 1200); do   # node2 comes back once training runs on node1
  n=$(grep -c '"loss"' "$work/elastic.jsonl" 2>/dev/null)
  [ "${n:-0}" -ge 12 ] && break
  kill -0 $launch 2>/dev/null || break
  # The probe gives up on node2 after 5 s: a launch that has not left it out within 30 s
  # is starting the job on it, and would hang until its mpirun gives up.
  if [ $((SECONDS - started)) -ge 30 ] &&
     ! grep -q "^tetra launch: node2 did not answer" "$work/elastic.out"; then
    fail "30 s on, tetra launch has not left the unreachable node2 out:"
    tail -n 20 "$work/elastic.out"
    exit 1
  fi
  sleep 0.1
done
echo "node2 back after step $(grep -c '"loss"' "$work/elastic.jsonl" 2>/dev/null)"
cluster link node2 up
wait $launch; rc=$?
grep "^tetra launch:\|^resumed from" "$work/elastic.out"
[ $rc -eq 0 ] || { fail "the elastic run did not finish (exit $rc):"; tail -n 20 "$work/elastic.out"; }
grep -q "^tetra launch: node2 did not answer through .*/agent within 5 s: left out of the hostfile" "$work/elastic.out" ||
  fail "no line naming node2 as left out"
grep -q "^tetra launch: the hostfile .* has 2 slots for a job of 4 processes: continuing on 2 (parallel.data_parallel_size 2 -> 1)" "$work/elastic.out" ||
  fail "no 'continuing on 2' line"
grep -q "^tetra launch: the hostfile .* has 4 slots again: growing to 4 processes at the job's next checkpoint" "$work/elastic.out" ||
  fail "no 'growing to 4' line"
grep -q "^tetra launch: restart 1: growing back to 4 processes" "$work/elastic.out" ||
  fail "no 'growing back' restart"
grep -q "^tetra launch: the hostfile .* has 4 slots: back to 4 processes (parallel.data_parallel_size 1 -> 2)" "$work/elastic.out" ||
  fail "no 'back to 4' line"
from=$(sed -n 's/^resumed from \(.*\) at step \([0-9]*\);.*/\1/p' "$work/elastic.out" | tail -n 1)
at=$(sed -n 's/^resumed from \(.*\) at step \([0-9]*\);.*/\2/p' "$work/elastic.out" | tail -n 1)
[ -n "$from" ] || { fail "the grown job did not resume"; exit 1; }

# The references: dp1 x tp2 from the start (its records to the checkpoint count), dp2 x
# tp2 resumed from the same checkpoint, both across the same hosts.
on_head mpirun -np 2 "${mpi_hosts[@]}" "$tetra" run "${job[@]}" \
  --set parallel.data_parallel_size=1 --set checkpoint.dir="$work/ref1.ck" \
  --set log.metrics_file="$work/ref1.jsonl" >"$work/ref1.out" 2>&1 ||
  { fail "the dp1 reference failed"; tail "$work/ref1.out"; }
on_head mpirun -np 4 "${mpi_hosts[@]}" "$tetra" run "${job[@]}" \
  --set parallel.data_parallel_size=2 --set checkpoint.dir="$work/ref2.ck" \
  --set checkpoint.resume="$from" --set log.metrics_file="$work/ref2.jsonl" \
  >"$work/ref2.out" 2>&1 || { fail "the dp2 reference failed"; tail "$work/ref2.out"; }

"$py" - "$work/elastic.jsonl" "$work/ref1.jsonl" "$work/ref2.jsonl" "$at" "$steps" <<'PY' || failed=1
import json, sys
load = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l]
el, ref1, ref2 = (load(p) for p in sys.argv[1:4])
at, steps = int(sys.argv[4]), int(sys.argv[5])
last = {}
for r in el:                      # steps run past the checkpoint before the stop ran again
    last[r["step"]] = r
key = lambda r: (r["step"], r["loss"], r["grad_norm"])
got = [key(last[s]) for s in sorted(last)]
want = [key(r) for r in ref1 if r["step"] <= at] + [key(r) for r in ref2 if r["step"] > at]
if sorted(last) != list(range(1, steps + 1)) or got != want:
    print(f"FAIL: the elastic run's records differ from dp1 to step {at} then dp2")
    print([(a, b) for a, b in zip(got, want) if a != b][:3])
    sys.exit(1)
if last[steps]["restarts"] != 1 or last[1]["restarts"] != 0:
    print("FAIL: the records do not count the one restart"); sys.exit(1)
print(f"elastic: steps 1-{at} on dp1 x tp2 and {at + 1}-{steps} on dp2 x tp2 equal the plain runs")
PY
[ -z "$(cluster procs)" ] || { fail "processes left on the hosts:"; cluster procs; }
[ $failed -eq 0 ] && echo PASS
exit $failed
