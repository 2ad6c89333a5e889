#!/usr/bin/env bash
# checkpoint.async=true: the state is copied to host memory at the step and written by a
# background thread (engine/io/ckpt_writer.c) while training goes on.
#  1. one process, 30 steps, a save every 10, the writer thread held back 1 s
#     (checkpoint.async_delay_ms, a test switch) so that each write overlaps the next
#     steps and the next save has to wait for it (at most one in flight): the async checkpoints' model and optimizer files equal the synchronous run's
#     byte for byte (the snapshot is the state of its step), and so do their checksums
#     (whole and per block), the metrics are the same,
#     and a run resumed from the async step-10 checkpoint continues exactly like the
#     synchronous run.
#  2. 4 ranks under tetra launch with async saves, each writer held 200 ms (so that a save
#     is in flight long enough to be found, however fast the steps): 4 SIGKILLs, each
#     while a checkpoint is being written (its .tmp.step_* directory exists: the thread is writing or the ranks
#     have yet to publish it); every restart resumes from `latest` (a partial checkpoint
#     there would stop the resume: it checks state.json and every checksum) and the
#     per-step records equal an uninterrupted synchronous run's bit for bit.
#  3. ZeRO-1 and ZeRO-3 on dp 2: async files equal sync ones byte for byte (below).
source "$(dirname "$0")/prelude.bash"
source "$root/tests/dist/launch_helpers.bash"
failed=0
one=(recipes/tiny.lua --set train.steps=30 --set checkpoint.every=10 --set checkpoint.keep=0)
for mode in sync async; do
  "$tetra" run "${one[@]}" --set checkpoint.async=$([ $mode = async ] && echo true || echo false) \
    --set checkpoint.async_delay_ms=$([ $mode = async ] && echo 1000 || echo 0) \
    --set checkpoint.dir="$work/$mode.ck" --set log.metrics_file="$work/$mode.jsonl" \
    >"$work/$mode.out" 2>&1 || { echo "FAIL: the $mode run failed"; tail "$work/$mode.out"; exit 1; }
done
for s in 10 20 30; do
  for f in model.safetensors optim.safetensors; do
    cmp "$work/sync.ck/step_0000$s/$f" "$work/async.ck/step_0000$s/$f" ||
      { echo "FAIL: step $s: $f differs between the sync and async saves"; failed=1; }
    # and so must its checksums: the whole file's CRC and each block's, which the writer
    # thread takes
    sums() { grep -o "\"$f\":{[^}]*}" "$1/step_0000$s/checksums.json"; }
    sync_sums=$(sums "$work/sync.ck")
    [[ "$sync_sums" == *'"blocks":"'[0-9a-f]* ]] && [ "$sync_sums" = "$(sums "$work/async.ck")" ] ||
      { echo "FAIL: step $s: $f's block sums differ between the sync and async saves"; failed=1; }
  done
done
same_records "$work/sync.jsonl" "$work/async.jsonl" 0 || failed=1
cp "$work/async.jsonl" "$work/resumed.jsonl"
"$tetra" run "${one[@]}" --set checkpoint.dir="$work/resumed.ck" \
  --set checkpoint.resume="$work/async.ck/step_000010" \
  --set log.metrics_file="$work/resumed.jsonl" >"$work/resumed.out" 2>&1 ||
  { echo "FAIL: the resumed run failed"; tail "$work/resumed.out"; failed=1; }
same_records "$work/sync.jsonl" "$work/resumed.jsonl" 0 || failed=1

# 3. ZeRO-1 and ZeRO-3 on dp 2: each rank's file holds its share of the gathered moments
# (ZeRO-1 and 3) and parameters (ZeRO-3, gathered one unit at a time), host copies of the
# save's own that the writer takes as they are; they must equal a synchronous save's byte
# for byte.
for z in 1 3; do
  for mode in sync async; do
    mpirun --oversubscribe -np 2 "$tetra" run recipes/tiny.lua --set train.steps=8 \
      --set checkpoint.every=4 --set checkpoint.keep=0 --set parallel.data_parallel_size=2 \
      --set parallel.zero_stage=$z --set model.n_layers=4 \
      --set checkpoint.async=$([ $mode = async ] && echo true || echo false) \
      --set checkpoint.async_delay_ms=$([ $mode = async ] && echo 300 || echo 0) \
      --set checkpoint.dir="$work/z$z.$mode.ck" >"$work/z$z.$mode.out" 2>&1 ||
      { echo "FAIL: the zero_stage=$z $mode run failed"; tail "$work/z$z.$mode.out"; exit 1; }
  done
  for s in 4 8; do
    # (each data-parallel rank writes its share: shard_0000R.safetensors and index.json)
    for f in shard_00000.safetensors shard_00001.safetensors index.json; do
      cmp "$work/z$z.sync.ck/step_00000$s/$f" "$work/z$z.async.ck/step_00000$s/$f" ||
        { echo "FAIL: zero_stage=$z, step $s: $f differs between the sync and async saves"; failed=1; }
    done
  done
done

kills=4
job=(recipes/tiny.lua --set parallel.data_parallel_size=4 --set train.steps=200
     --set checkpoint.every=4 --set log.every=100)
mpirun --oversubscribe -np 4 "$tetra" run "${job[@]}" --set checkpoint.dir="$work/ref.ck" \
  --set log.metrics_file="$work/ref.jsonl" >"$work/ref.out" 2>&1 ||
  { echo "FAIL: the uninterrupted run failed"; tail "$work/ref.out"; exit 1; }
ck="$work/chaos.ck"
"$tetra" launch --max-restarts $((kills + 3)) --backoff 0.1 -- \
  mpirun --oversubscribe -np 4 "$tetra" run "${job[@]}" --set checkpoint.async=true \
  --set checkpoint.async_delay_ms=200 \
  --set checkpoint.dir="$ck" --set log.metrics_file="$work/chaos.jsonl" >"$work/chaos.out" 2>&1 &
launch=$!
chaos $launch "$ck" $kills 1 || { echo "FAIL: kill $((chaos_done + 1)): the job was not running"; failed=1; }
wait $launch; rc=$?
echo "async chaos: $chaos_done kills, $chaos_during_save during a save, exit $rc"
[ $rc -eq 0 ] || { echo "FAIL: the async chaos run did not finish"; grep -v "^step" "$work/chaos.out" | tail -20; failed=1; }
# Each kill waits for a save in progress, but a save can finish between that look and the
# kill (this failed once in CI with 3 of 4): most of them must land in one.
[ "$chaos_during_save" -ge $(( (kills + 1) / 2 )) ] ||
  { echo "FAIL: only $chaos_during_save of $kills kills landed during a save"; failed=1; }
grep -q "incomplete\|is missing" "$work/chaos.out" && { echo "FAIL: a resume met a partial checkpoint"; failed=1; }
same_records "$work/ref.jsonl" "$work/chaos.jsonl" $kills || failed=1
exit $failed
