#!/usr/bin/env bash
# A host cut off mid-run, on a namespace cluster of 4 hosts x 2 slots (tools/cluster):
# dp2 x tp2 x pp2 trains until node3's eth0 goes down. Then the whole job must end
# (mpirun exits non-zero) within dist.timeout_s + 30 s of the cut; the survivors report
# one line naming the collective, the group, the step and the host that does not answer
# with its ranks ("host node3 (world ranks 4,5) does not answer"); node3's own ranks
# report being cut off (their stderr also goes to files: it cannot reach mpirun) and end
# themselves; and no process of the job is left on any host. Three times: mpirun with
# the oob keepalive settings of docs/multinode.md; plain mpirun under `tetra launch`,
# which sets them; and, where iptables is installed, node3's packets dropped instead of
# its link down. Its cases, for TETRA_TEST_CASES (prelude.bash's wanted): mpirun, launch,
# drop.
# Usage: bash cluster_link_down.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
source "$(dirname "$0")/cluster.bash"
cluster_up 4 2
timeout_s=3
failed=0
fail() { echo "FAIL: $*"; failed=1; }

run_case() {   # run_case NAME down|drop LAUNCH-WORDS...: the job, started on node1 by the words
  local name="$1" how="$2"; shift 2
  status=$failed; stop_if_failed   # (prelude.bash: under tools/mutate, a failed case ends it)
  wanted "$name" || return 0
  local out="$work/$name"
  mkdir -p "$out"
  cluster link node3 up
  echo "-- $name"
  local start job steps cut rc ended left gone took clean
  start=$(date +%s.%N)
  # Each rank's stderr also goes to a file of its own, on the filesystem the hosts share.
  on_head timeout -k 10 300 "$@" -np 8 "${mpi_hosts[@]}" bash -c \
    'exec "$0" "$@" 2> >(tee "'"$out"'/rank$OMPI_COMM_WORLD_RANK.err" >&2)' \
    "$tetra" run recipes/tiny.lua --set parallel.tensor_parallel_size=2 \
    --set parallel.data_parallel_size=2 --set parallel.pipeline_parallel_size=2 \
    --set train.steps=1000000 --set train.batch_size=16 --set model.n_layers=8 \
    --set model.n_heads=8 --set model.n_kv_heads=8 --set model.ffn_hidden=128 \
    --set dist.timeout_s=$timeout_s --set log.metrics_file="$out/metrics.jsonl" \
    >"$out/mpirun.log" 2>&1 &
  job=$!
  # Cut the link once training runs.
  for _ in $(seq 1 600); do
    steps=$(grep -c '"loss"' "$out/metrics.jsonl" 2>/dev/null)
    [ "${steps:-0}" -ge 5 ] && break
    kill -0 $job 2>/dev/null || break
    sleep 0.1
  done
  kill -0 $job 2>/dev/null || { fail "the job ended before the cut:"; cat "$out/mpirun.log"; return; }
  cut=$(date +%s.%N)
  cluster link node3 "$how"
  echo "node3 cut off ($how) after $(echo "$cut $start" | awk '{ printf "%.1f", $1 - $2 }') s," \
       "at step $(grep -c '"loss"' "$out/metrics.jsonl")"
  wait $job
  rc=$?
  ended=$(date +%s.%N)
  # Every process of the job on every host, gone.
  left=""
  for _ in $(seq 1 $(( (timeout_s + 30) * 10 ))); do
    left="$(cluster procs)"
    [ -z "$left" ] && break
    sleep 0.1
  done
  gone=$(date +%s.%N)
  took=$(echo "$ended $cut" | awk '{ printf "%.1f", $1 - $2 }')
  clean=$(echo "$gone $cut" | awk '{ printf "%.1f", $1 - $2 }')
  echo "exit status $rc, $took s after the cut; every host empty $clean s after it"
  grep -h "watchdog:" "$out/mpirun.log" | head -n 1
  grep -h "watchdog:" "$out/rank4.err" 2>/dev/null | head -n 1

  [ "$rc" -ne 0 ] || fail "$name: exit status 0"
  { [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ]; } || fail "$name: the job hung (killed by timeout 300)"
  awk -v t="$took" -v lim=$((timeout_s + 30)) 'BEGIN { exit !(t > lim) }' &&
    fail "$name: the job took $took s to end, over dist.timeout_s + 30"
  [ -z "$left" ] || { fail "$name: processes left on the hosts:"; echo "$left"; }
  local line='watchdog: [a-z_]* on group [a-z]* \(world ranks [0-9,]*; .*\) at step [0-9]* has not completed .*; host node3 \(world ranks 4,5\) does not answer'
  grep -Eq "$line" "$out/mpirun.log" ||
    { fail "$name: no survivor's line names node3 and its ranks:"; tail -n 30 "$out/mpirun.log"; }
  local r
  for r in 4 5; do
    grep -q "watchdog: .*this host (node3) is cut off" "$out/rank$r.err" 2>/dev/null ||
      { fail "$name: rank $r on node3 did not report being cut off:"; cat "$out/rank$r.err" 2>/dev/null; }
  done
}

run_case mpirun down mpirun "${mpi_keepalive[@]}"
run_case launch down "$tetra" launch --max-restarts 0 -- mpirun
if command -v iptables >/dev/null; then
  run_case drop drop mpirun "${mpi_keepalive[@]}"
else
  echo "-- drop: not run (no iptables)"
fi
[ $failed -eq 0 ] && echo PASS
exit $failed
