#!/usr/bin/env bash
# Files a run writes that cannot be written (here: past the file-size limit, `ulimit -f`,
# which fails a write as a full disk or a quota would).
# - A checkpoint stops the run with one line naming the step, the file and the reason;
#   its partial files are removed; `latest` still names the checkpoint before, and a
#   resume from it works. It was a Lua traceback (under a size limit, a kill by SIGXFSZ)
#   that left the partial folder behind, filling the disk it ran out of. Cases: one
#   process with a synchronous save, one with checkpoint.async (the writer thread's
#   error), and tensor parallelism on 2 ranks (each rank writes a shard).
# - The logs (log.metrics_file, log.log_file) warn once each and the run goes on; they
#   were truncated without a word.
# Usage: bash write_fail.sh /path/to/tetra   (exit 77: skipped)
source "$(dirname "$0")/prelude.bash"
status=0
# A tiny Llama of one layer: model.safetensors 11.8 MB, optim.safetensors 23.6 MB; under
# tp 2 each rank's shard is 17.7 MB.
base=(run recipes/configs/tiny.yaml --set train.warmup_steps=0 --set model.n_layers=1
      --set log.every=1)

# case NAME LIMIT_KB FAILED_STEP FILE RUN... : a first run saves step 1; a second resumes
# from it and trains on under the size limit: its save of FAILED_STEP must fail as above
# (FILE: a glob; under mpirun either rank's line may come first). extra: more --set.
case_() {
  local name=$1 limit=$2 failed=$3 file=$4; shift 4
  wanted "$name" || return 0
  stop_if_failed
  local dir="$work/$name"
  "$@" "${base[@]}" --set train.steps=1 --set checkpoint.dir="$dir" "${extra[@]}" >"$work/first.log" 2>&1 ||
    { echo "FAIL: $name: the first run failed:"; cat "$work/first.log"; status=1; return; }
  (ulimit -f "$limit"; exec timeout 120 "$@" "${base[@]}" --set train.steps=3 \
     --set checkpoint.dir="$dir" --set checkpoint.every=1 --set checkpoint.resume=auto "${extra[@]}" \
     >"$work/out.log" 2>"$work/err.log")
  local rc=$?
  local want="tetra: checkpoint: step $failed was not saved: safetensors: writing $dir/.tmp.step_00000$failed/$file.tmp: File too large (its partial files were removed; the last checkpoint is still $dir/step_000001)"
  if [ $rc -eq 0 ] || [ $rc -ge 124 ]; then
    echo "FAIL: $name: exited $rc (0: the save went through; 124: it hung; over 128: a signal)"
    cat "$work/err.log"; status=1; return
  fi
  local line found=0
  while IFS= read -r line; do [[ "$line" == $want ]] && found=1; done <"$work/err.log"
  if [ $found -eq 0 ]; then
    echo "FAIL: $name: expected the line"; echo "  $want"; echo "got:"; cat "$work/err.log"
    status=1; return
  fi
  if grep -q "stack traceback" "$work/err.log"; then
    echo "FAIL: $name: a traceback:"; cat "$work/err.log"; status=1; return
  fi
  [ "$(cat "$dir/latest")" = step_000001 ] || { echo "FAIL: $name: latest moved"; status=1; return; }
  # One process removes the partial folder. Under mpirun the rank that fails first
  # aborts the job, which may stop rank 0 before it has removed it: a later save of that
  # step replaces it, and a resume ignores it.
  if [ "$name" != tp2 ] && [ -e "$dir/.tmp.step_00000$failed" ]; then
    echo "FAIL: $name: the partial folder is still there:"; ls -la "$dir"/.tmp*; status=1; return
  fi
  "$@" "${base[@]}" --set train.steps=3 --set checkpoint.dir="$dir" --set checkpoint.resume=auto \
    "${extra[@]}" >"$work/resume.log" 2>&1 ||
    { echo "FAIL: $name: the resume without a limit failed:"; cat "$work/resume.log"; status=1; return; }
  grep -q "resumed from $dir/step_000001 at step 1" "$work/resume.log" ||
    { echo "FAIL: $name: no resume from step 1:"; cat "$work/resume.log"; status=1; return; }
  echo "$name: step $failed not saved, one line, step 1 kept and resumed from"
}

extra=()
case_ sync 16000 2 optim.safetensors "$tetra"
# The asynchronous save of step 2 fails on the writer thread; step 3 reports it.
extra=(--set checkpoint.async=true)
case_ async 16000 2 optim.safetensors "$tetra"
extra=(--set parallel.tensor_parallel_size=2)
case_ tp2 8000 2 "shard_0000[01].safetensors" mpirun --oversubscribe -np 2 "$tetra"

# The metrics file and the rank log past the limit: a warning each, once, and the run
# trains to its end (they were truncated without a word).
if wanted logs; then
  stop_if_failed
  (ulimit -f 1; exec timeout 120 "$tetra" "${base[@]}" --set train.steps=12 --set log.every=4 \
     --set log.metrics_file="$work/m.jsonl" --set log.log_file="$work/l.txt" \
     >"$work/out.log" 2>"$work/err.log")
  rc=$?
  w1="tetra: warning: log.metrics_file: writing $work/m.jsonl failed: File too large; the run goes on without it"
  w2="tetra: warning: log.log_file: writing $work/l.txt failed: File too large; the run goes on without it"
  if [ $rc -ne 0 ]; then
    echo "FAIL: logs: exited $rc"; cat "$work/err.log"; status=1
  elif [ "$(grep -cxF -- "$w1" "$work/err.log")" != 1 ] || [ "$(grep -cxF -- "$w2" "$work/err.log")" != 1 ] ||
       [ "$(wc -l <"$work/err.log")" != 2 ]; then
    echo "FAIL: logs: expected one warning for each file, got:"; cat "$work/err.log"; status=1
  elif ! grep -q "^done: 12 steps" "$work/out.log"; then
    echo "FAIL: logs: the run did not train to its end:"; cat "$work/out.log"; status=1
  else
    echo "logs: one warning each, the run trained on"
  fi
fi

[ $status -eq 0 ] && echo PASS
exit $status
