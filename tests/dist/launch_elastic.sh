#!/usr/bin/env bash
# tetra launch --min-np: a node lost from the allocation. The job runs 4 data-parallel
# ranks from a hostfile of 4 slots; once it has checkpoints, the hostfile shrinks to 2
# slots (what a scheduler does when a node goes) and one rank is killed. tetra launch
# restarts the job on 2 processes with parallel.data_parallel_size 2 from the latest
# checkpoint, and the run finishes; its records after that checkpoint equal those of a
# plain 2-rank run resumed from the same checkpoint, bit for bit. Then with 1 slot left
# (below --min-np 2) it gives up with one line.
source "$(dirname "$0")/prelude.bash"
py="${PYTHON:-python3}"
failed=0
hosts="$work/hostfile"
echo "localhost slots=4" >"$hosts"
job=(recipes/tiny.lua --set train.steps=200 --set checkpoint.every=4 --set checkpoint.keep=0
     --set log.every=50)

"$tetra" launch --min-np 2 --backoff 0.1 -- \
  mpirun --oversubscribe --hostfile "$hosts" -np 4 "$tetra" run "${job[@]}" \
  --set parallel.data_parallel_size=4 --set checkpoint.dir="$work/ck" \
  --set log.metrics_file="$work/elastic.jsonl" >"$work/elastic.out" 2>&1 &
launch=$!
for ((i = 0; i < 2000; i++)); do   # wait for a checkpoint
  [ -f "$work/ck/latest" ] && break
  sleep 0.01
done
echo "# localhost lost half its slots" >"$hosts"
echo "localhost slots=2" >>"$hosts"
mp=$(ps -o pid= --ppid "$launch" | awk "NR == 1 {print \$1}")
mapfile -t pids < <(ps -o pid= --ppid "$mp" | awk "{print \$1}")
echo "ranks: ${pids[*]} (mpirun $mp)"
[ "${#pids[@]}" -eq 4 ] && kill -KILL ${pids[1]} ||
  { echo "FAIL: could not kill a rank of the running job"; failed=1; }
wait $launch; rc=$?
grep "^tetra launch:\|^resumed from" "$work/elastic.out"
[ $rc -eq 0 ] || { echo "FAIL: the elastic run did not finish (exit $rc)"; tail "$work/elastic.out"; failed=1; }
grep -q "^tetra launch: the hostfile .* has 2 slots for a job of 4 processes: continuing on 2 (parallel.data_parallel_size 4 -> 2)" "$work/elastic.out" ||
  { echo "FAIL: no 'continuing on 2' line"; failed=1; }
from=$(sed -n 's/^resumed from \(.*\) at step \([0-9]*\);.*/\1/p' "$work/elastic.out" | tail -n 1)
step=$(sed -n 's/^resumed from \(.*\) at step \([0-9]*\);.*/\2/p' "$work/elastic.out" | tail -n 1)
[ -n "$from" ] || { echo "FAIL: the restarted job did not resume"; exit 1; }

mpirun --oversubscribe -np 2 "$tetra" run "${job[@]}" --set parallel.data_parallel_size=2 \
  --set checkpoint.dir="$work/ref.ck" --set checkpoint.resume="$from" \
  --set log.metrics_file="$work/ref.jsonl" >"$work/ref.out" 2>&1 ||
  { echo "FAIL: the reference 2-rank run failed"; tail "$work/ref.out"; failed=1; }

"$py" - "$work/elastic.jsonl" "$work/ref.jsonl" "$step" <<'PY' || failed=1
import json, sys
el = [json.loads(l) for l in open(sys.argv[1])]
ref = [json.loads(l) for l in open(sys.argv[2])]
n = int(sys.argv[3])
key = lambda rs: [(r["step"], r["loss"], r["grad_norm"]) for r in rs if r["step"] > n]
if key(el) != key(ref) or len(key(ref)) != 200 - n:
    print(f"FAIL: after step {n} the elastic run's records differ from the 2-rank run's")
    print([(a, b) for a, b in zip(key(el), key(ref)) if a != b][:3])
    sys.exit(1)
if [r["step"] for r in el] != list(range(1, 201)) or el[-1]["restarts"] != 1:
    print("FAIL: the elastic run's records are not steps 1-200 ending with restarts 1"); sys.exit(1)
print(f"elastic: steps {n + 1}-200 on 2 ranks equal a 2-rank run resumed from step {n}")
PY

echo "localhost slots=1" >"$hosts"
"$tetra" launch --min-np 2 -- mpirun --oversubscribe --hostfile "$hosts" -np 4 "$tetra" run \
  "${job[@]}" --set parallel.data_parallel_size=4 --set checkpoint.dir="$work/ck2" \
  >"$work/few.out" 2>&1; rc=$?
cat "$work/few.out"
[ $rc -ne 0 ] && grep -q "^tetra launch: giving up: the hostfile .* has 1 slots; the largest job .* has 1, below --min-np 2" "$work/few.out" ||
  { echo "FAIL: 1 slot with --min-np 2: exit $rc"; failed=1; }
exit $failed
