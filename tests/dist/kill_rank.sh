#!/usr/bin/env bash
# The watchdog: 4 ranks all-reduce in a loop (hang_worker.lua); at step 10 rank 2 dies
# (SIGKILL, with mpirun told not to tear the job down itself) or hangs (SIGSTOP). Every
# other rank must report "watchdog: all_reduce on group dp ... at step 10" (a reporting
# rank waits 2 s before aborting the job, so that its peers report too) and the job must
# end within dist.timeout_s plus a margin: no rank left hanging. A third case hangs rank 2
# where the others make a group (MPI_Comm_split blocks and cannot poll): the watchdog
# thread must report "comm_split on group dp" the same way.
# Usage: bash kill_rank.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
here="$(cd "$(dirname "$0")" && pwd)"
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
timeout_s=4
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
failed=0

run_case() {   # signal, the call the others wait in, extra mpirun args
  local sig="$1" op="$2"; shift 2
  local start end rc
  start=$(date +%s)
  TT_HANG_SIGNAL="$sig" TT_HANG_AT="$op" TT_TIMEOUT="$timeout_s" timeout -k 10 30 \
    mpirun --oversubscribe "$@" -np 4 -x TT_HANG_SIGNAL -x TT_HANG_AT -x TT_TIMEOUT \
    "$tetra" run "$here/hang_worker.lua" >"$log" 2>&1
  rc=$?
  end=$(date +%s)
  # A job that timed out can leave ranks behind (a stopped one ignores the launcher's
  # SIGTERM): none may outlive the case, holding the binary and the cores.
  local n
  for n in 1 2 3 4 5 6 7 8 9 10; do
    pkill -KILL -f -- "$here/hang_worker.lua" || break
    sleep 0.5
  done
  local reports
  reports=$(grep -c "watchdog: $op on group dp .* at step 10 has not completed" "$log")
  echo "SIG$sig in $op: exit $rc after $((end - start)) s, $reports watchdog reports"
  grep "watchdog:" "$log" | head -n 3
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
    echo "FAIL: SIG$sig: the job did not abort (exit $rc)"; failed=1
  fi
  if [ $((end - start)) -gt $((timeout_s + 20)) ]; then
    echo "FAIL: SIG$sig: took $((end - start)) s, over dist.timeout_s + 20"; failed=1
  fi
  # Every survivor (ranks 0, 1 and 3) reports, each once.
  local r
  for r in 0 1 3; do
    if [ "$(grep -c "rank $r: watchdog: $op on group dp .* at step 10" "$log")" -ne 1 ]; then
      echo "FAIL: SIG$sig: rank $r did not report exactly once"; sed -n '1,20p' "$log"; failed=1
    fi
  done
  if grep -q "rank 2: watchdog" "$log"; then
    echo "FAIL: SIG$sig: the dead rank 2 reported"; failed=1
  fi
}

# (the blocked case first: under TETRA_TEST_STOP_AT_FAILURE, tools/mutate's, a failed
# case ends the script)
for c in "STOP comm_split" "KILL all_reduce --mca orte_abort_on_non_zero_status 0" \
         "STOP all_reduce"; do
  [ -n "${TETRA_TEST_STOP_AT_FAILURE:-}" ] && [ "$failed" != 0 ] && break
  run_case $c
done
exit $failed
