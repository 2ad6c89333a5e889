#!/usr/bin/env bash
# SIGUSR1 (a scheduler's notice before preemption or a time limit) stops a training run
# at the next step boundary with a checkpoint of that step: every rank agrees on the step,
# the run prints one line naming the checkpoint and exits with status 3, and a resume
# from checkpoint.resume=auto goes on from it. Before, SIGUSR1 killed the run and the
# steps since the last checkpoint were lost. Cases: one process; tensor parallelism on 2
# ranks with asynchronous saves, the signal sent to rank 1 alone; tetra launch over
# mpirun (both pass the signal on; launch does not restart a job that stopped so); a run
# without checkpoint.dir, which stops and says nothing was saved.
# Usage: bash stop_signal.sh /path/to/tetra   (exit 77: skipped)
source "$(dirname "$0")/prelude.bash"
status=0
base=(run recipes/configs/tiny.yaml --set train.warmup_steps=0 --set model.n_layers=1
      --set log.every=1 --set train.steps=2000)

# The process of world rank R among the children of process P.
rank_pid() {
  local c
  for c in $(pgrep -P "$1"); do
    tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$c"; return; }
  done
}

# start NAME CMD...: runs CMD in the background (output in $work/NAME.out), waits for its
# third step and sends SIGUSR1 to it (with to_rank set, to that rank of an mpirun child
# alone); then waits for it: rc is its status. A run still going 30 s later is killed.
start() {
  local name=$1; shift
  "$@" >"$work/$name.out" 2>&1 &
  local pid=$! i target
  for i in $(seq 600); do
    [ "$(grep -cE '^step +[0-9]+/' "$work/$name.out")" -ge 3 ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  target=$pid
  [ -n "${to_rank:-}" ] && target=$(rank_pid $pid "$to_rank")
  [ -n "$target" ] || echo "FAIL: $name: no process of rank $to_rank under $pid"
  kill -USR1 "${target:-$pid}" 2>/dev/null
  # (The guard's sleep must not hold ctest's output open once the run is over.)
  ( sleep 30; kill -9 $pid ) >/dev/null 2>&1 & local guard=$!
  wait $pid; rc=$?
  pkill -P $guard 2>/dev/null; kill $guard 2>/dev/null; wait $guard 2>/dev/null
}

# check NAME DIR: exit status 3, the line, `latest` at the step it names, and a resume.
check() {
  local name=$1 dir=$2; shift 2
  local out="$work/$name.out"
  [ $rc -eq 3 ] || { echo "FAIL: $name: exited $rc, expected 3"; tail -n 20 "$out"; status=1; return 1; }
  # Every rank agreed to exit so: MPI is finalized, the job not aborted.
  grep -q "aborting the job" "$out" && { echo "FAIL: $name: the job was aborted:"; grep tetra: "$out"; status=1; return 1; }
  local line; line=$(grep -E '^stopped by SIGUSR1 after step [0-9]+: ' "$out")
  local n; n=$(sed -nE 's/^stopped by SIGUSR1 after step ([0-9]+): .*/\1/p' <<<"$line")
  [ -n "$n" ] || { echo "FAIL: $name: no 'stopped by SIGUSR1' line:"; tail -n 20 "$out"; status=1; return 1; }
  [ "$n" -ge 3 ] && [ "$n" -lt 2000 ] || { echo "FAIL: $name: stopped after step $n"; status=1; return 1; }
  local ck; ck=$(printf 'step_%06d' "$n")
  local want="stopped by SIGUSR1 after step $n: checkpoint $dir/$ck; continue with --set checkpoint.resume=auto"
  [ "$line" = "$want" ] || { echo "FAIL: $name: expected '$want', got '$line'"; status=1; return 1; }
  [ "$(cat "$dir/latest" 2>/dev/null)" = "$ck" ] && [ -f "$dir/$ck/state.json" ] ||
    { echo "FAIL: $name: latest is not a complete $ck:"; ls -la "$dir"; status=1; return 1; }
  ls -d "$dir"/.tmp.* >/dev/null 2>&1 && { echo "FAIL: $name: a partial save is left:"; ls -la "$dir"; status=1; return 1; }
  "$@" "${base[@]}" --set train.steps=$((n + 2)) --set checkpoint.dir="$dir" \
    --set checkpoint.resume=auto "${extra[@]}" >"$work/$name.resume" 2>&1 ||
    { echo "FAIL: $name: the resume failed:"; tail -n 20 "$work/$name.resume"; status=1; return 1; }
  grep -q "^resumed from $dir/$ck at step $n; continuing at step $((n + 1))" "$work/$name.resume" ||
    { echo "FAIL: $name: no resume from $ck:"; tail -n 20 "$work/$name.resume"; status=1; return 1; }
  echo "$name: stopped after step $n with its checkpoint, resumed from it"
}

if wanted one; then
  stop_if_failed
  extra=()
  start one "$tetra" "${base[@]}" --set checkpoint.dir="$work/one"
  check one "$work/one" "$tetra"
fi

# The signal reaches rank 1 alone: rank 0 must stop after the same step.
if wanted tp2; then
  stop_if_failed
  extra=(--set parallel.tensor_parallel_size=2)
  to_rank=1 start tp2 mpirun --oversubscribe -np 2 "$tetra" "${base[@]}" --set checkpoint.dir="$work/tp2" \
    --set checkpoint.async=true --set checkpoint.every=2 "${extra[@]}"
  check tp2 "$work/tp2" mpirun --oversubscribe -np 2 "$tetra"
fi

if wanted launch; then
  stop_if_failed
  extra=(--set parallel.data_parallel_size=2)
  start launch "$tetra" launch --backoff 0 --max-restarts 0 -- mpirun --oversubscribe -np 2 "$tetra" "${base[@]}" \
    --set checkpoint.dir="$work/launch" "${extra[@]}"
  if check launch "$work/launch" mpirun --oversubscribe -np 2 "$tetra"; then
    grep -qF "tetra launch: the job stopped at SIGUSR1 after saving a checkpoint: not restarted" \
      "$work/launch.out" && ! grep -q "tetra launch: restart" "$work/launch.out" ||
      { echo "FAIL: launch: the supervisor did not stop with the job:"; grep "tetra launch" "$work/launch.out"; status=1; }
  fi
fi

if wanted no_dir; then
  stop_if_failed
  start no_dir "$tetra" "${base[@]}"
  if [ $rc -ne 3 ] || ! grep -qE "^stopped by SIGUSR1 after step [0-9]+: no checkpoint.dir, so nothing was saved$" "$work/no_dir.out"; then
    echo "FAIL: no_dir: exited $rc:"; tail -n 5 "$work/no_dir.out"; status=1
  else
    echo "no_dir: stopped, and said nothing was saved"
  fi
fi

[ $status -eq 0 ] && echo PASS
exit $status
