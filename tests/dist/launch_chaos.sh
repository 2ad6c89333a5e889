#!/usr/bin/env bash
# tetra launch under faults (4 ranks, data parallel, tiny Llama, a checkpoint every 4
# steps):
#  1. chaos: $KILLS (default 10) SIGKILLs of a random rank at random moments (each once
#     the job has written a new checkpoint), every other one while a checkpoint is being
#     written (a .tmp.step_* directory exists);
#     every save is held 100 ms before it is published (checkpoint.save_delay_ms, a test
#     switch), so that the kills meant for a save find one however fast the steps are;
#     the run finishes and its metrics records (loss and gradient norm of every step)
#     equal an uninterrupted run's bit for bit; each restart is a logged line, the count
#     reaches the job (records' `restarts`), and `latest` names a complete checkpoint;
#     no watchdog report (dist.timeout_s=60: a job stuck in a collective ends with the
#     report of where, a failure, instead of holding the test).
#  2. a SIGSTOPped rank: the watchdog (dist.timeout_s=5) aborts the job, tetra launch
#     restarts it, and the losses again equal the uninterrupted run's.
#  3. a deterministic failure (train.inject_crash_step=3 fails every time at step 3):
#     two tries, then one line saying why, and the job's exit status.
#  4. usage errors: one line, exit 2.
source "$(dirname "$0")/prelude.bash"
source "$root/tests/dist/launch_helpers.bash"
kills="${KILLS:-10}"
steps=200
failed=0
job=(recipes/tiny.lua --set parallel.data_parallel_size=4 --set train.steps=$steps
     --set checkpoint.every=4 --set log.every=100)

"$tetra" launch >"$work/usage.out" 2>&1; rc=$?
if [ $rc -ne 2 ] || [ "$(wc -l <"$work/usage.out")" -ne 1 ]; then
  echo "FAIL: tetra launch without a command: exit $rc"; cat "$work/usage.out"; failed=1
fi
"$tetra" launch --max-restarts x -- true >"$work/usage.out" 2>&1; rc=$?
grep -q "max-restarts needs a whole number" "$work/usage.out" && [ $rc -eq 2 ] ||
  { echo "FAIL: --max-restarts x: exit $rc"; cat "$work/usage.out"; failed=1; }

mpirun --oversubscribe -np 4 "$tetra" run "${job[@]}" --set checkpoint.dir="$work/ref.ck" \
  --set log.metrics_file="$work/ref.jsonl" >"$work/ref.out" 2>&1 ||
  { echo "FAIL: the uninterrupted run failed"; tail "$work/ref.out"; exit 1; }

# -- 1. chaos ------------------------------------------------------------------------
ck="$work/chaos.ck"
"$tetra" launch --max-restarts $((kills + 5)) --backoff 0.1 -- \
  mpirun --oversubscribe -np 4 "$tetra" run "${job[@]}" --set checkpoint.dir="$ck" \
  --set checkpoint.save_delay_ms=100 --set log.metrics_file="$work/chaos.jsonl" \
  --set dist.timeout_s=60 >"$work/chaos.out" 2>&1 &
launch=$!
if ! chaos $launch "$ck" "$kills" 2; then
  # What the job was doing, and a bounded wait: a job stuck there would otherwise hold the
  # test until ctest's limit, saying nothing (seen once in CI after the 9th kill).
  if kill -0 $launch 2>/dev/null; then
    echo "FAIL: kill $((chaos_done + 1)): no job ran with 4 ranks (and a save, for the even kills)"
    echo "  within 60 s; latest: $(cat "$ck/latest" 2>/dev/null); the job's processes:"
  else
    echo "FAIL: kill $((chaos_done + 1)): the job had ended (latest: $(cat "$ck/latest" 2>/dev/null))"
  fi
  mp=$(job_of "$launch")   # (not $job: the later cases run that command)
  [ -n "$mp" ] && ps -o pid=,stat=,etime=,args= --ppid "$mp" | cut -c1-120 | sed 's/^/    /'
  tail -n 12 "$work/chaos.out" | sed 's/^/  | /'
  failed=1
  for ((i = 0; i < 600; i++)); do kill -0 $launch 2>/dev/null || break; sleep 0.2; done
  if kill -0 $launch 2>/dev/null; then
    echo "  (still running after 120 s: stopped)"
    mp=$(job_of "$launch")
    [ -n "$mp" ] && { pkill -KILL -P "$mp"; kill -KILL "$mp"; } 2>/dev/null
    kill -KILL $launch 2>/dev/null
  fi
fi
during_save=$chaos_during_save
wait $launch; rc=$?
restarts=$(grep -c "^tetra launch: restart [0-9]*: the job failed (killed by signal 9" "$work/chaos.out")
last=$(grep -o "^tetra launch: restart [0-9]*: the job failed (killed by signal 9 (exit 137) after step [0-9]*" "$work/chaos.out" |
       tail -n 1 | grep -o "[0-9]*$")
echo "chaos: $kills kills ($during_save while a checkpoint was being written), $restarts restarts, the last after step ${last:-?} of $steps, exit $rc"
[ $rc -eq 0 ] || { echo "FAIL: the chaos run did not finish"; tail -20 "$work/chaos.out"; failed=1; }
[ "$restarts" -eq "$kills" ] || { echo "FAIL: $restarts restarts logged for $kills kills"; grep "tetra launch" "$work/chaos.out"; failed=1; }
# (a job stuck in a collective: the watchdog's report, within dist.timeout_s)
grep -m 3 "watchdog:" "$work/chaos.out" | sed 's/^/FAIL: /' | grep . && failed=1
[ "$during_save" -ge 1 ] || { echo "FAIL: no kill landed during a save"; failed=1; }
[ "$(cat "$ck/latest")" = step_000$steps ] && [ -f "$ck/step_000$steps/state.json" ] ||
  { echo "FAIL: latest is $(cat "$ck/latest")"; failed=1; }
# Restarts continue from a checkpoint (a kill that lands in the next start-up, before
# the resume, is a restart without its own "resumed from" line).
resumed=$(grep -c "^resumed from .*step_[0-9]* at step [1-9]" "$work/chaos.out")
[ "$resumed" -ge $((restarts / 2)) ] ||
  { echo "FAIL: only $resumed of $restarts restarts resumed from a checkpoint"; failed=1; }
same_records "$work/ref.jsonl" "$work/chaos.jsonl" "$kills" || failed=1

# -- 2. a stopped rank ---------------------------------------------------------------
"$tetra" launch --max-restarts 2 --backoff 0.1 -- \
  mpirun --oversubscribe -np 4 "$tetra" run "${job[@]}" --set checkpoint.dir="$work/stop.ck" \
  --set dist.timeout_s=5 --set log.metrics_file="$work/stop.jsonl" >"$work/stop.out" 2>&1 &
launch=$!
for ((i = 0; i < 6000; i++)); do   # training, not start-up (the watchdog guards collectives)
  [ -f "$work/stop.ck/latest" ] && break
  sleep 0.01
done
mapfile -t pids < <(ranks_of "$launch")
kill -STOP "${pids[2]}"
start=$(date +%s)
wait $launch; rc=$?
echo "stopped rank: exit $rc after $(( $(date +%s) - start )) s"
grep "watchdog:" "$work/stop.out" | head -n 1
grep "^tetra launch:" "$work/stop.out"
[ $rc -eq 0 ] || { echo "FAIL: the run with a stopped rank did not finish"; tail "$work/stop.out"; failed=1; }
grep -q "watchdog: .* has not completed" "$work/stop.out" || { echo "FAIL: no watchdog report"; failed=1; }
grep -q "^tetra launch: restart 1: the job failed" "$work/stop.out" || { echo "FAIL: no restart"; failed=1; }
same_records "$work/ref.jsonl" "$work/stop.jsonl" 1 || failed=1

# -- 3. a deterministic failure ------------------------------------------------------
"$tetra" launch --max-restarts 5 --backoff 0.1 -- \
  mpirun --oversubscribe -np 4 "$tetra" run "${job[@]}" --set checkpoint.dir="$work/det.ck" \
  --set train.inject_crash_step=3 >"$work/det.out" 2>&1; rc=$?
grep "^tetra launch:" "$work/det.out"
tries=$(grep -c "failing at step 3 on purpose" "$work/det.out")
[ $rc -eq 1 ] || { echo "FAIL: deterministic failure: exit $rc, want the job's 1"; tail "$work/det.out"; failed=1; }
[ "$(grep -c "^tetra launch: restart" "$work/det.out")" -eq 1 ] ||
  { echo "FAIL: deterministic failure: not exactly one restart"; failed=1; }
grep -q "^tetra launch: giving up: the job failed twice the same way (exit 1 after step 2)" "$work/det.out" ||
  { echo "FAIL: no 'giving up' line"; failed=1; }
[ "$tries" -ge 2 ] || { echo "FAIL: the failing step ran $tries times"; failed=1; }
exit $failed
