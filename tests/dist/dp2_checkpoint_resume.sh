#!/usr/bin/env bash
# Checkpoint resume on 2 data-parallel ranks, plain DP (each rank holds everything and
# writes its share of the parameters and moments, a load reads each slice on one rank
# and broadcasts it) and ZeRO-1 (the ranks put their shards' AdamW moments together, and
# each writes its share: shard_0000R.safetensors, index.json): the tiny Llama recipe runs
# 12 steps saving every 6; then,
# as if the job had died after step 7, the step-12 checkpoint goes, `latest` names
# step 6, and a second mpirun resumes from it. Its metrics file must hold steps 1..12
# with loss, lr and grad_norm identical (as text) to the uninterrupted run's. Then a byte
# of each checkpoint's second shard file is changed: the resume must stop and name it.
# Usage: bash dp2_checkpoint_resume.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ -f "$root/recipes/tiny.lua" ] || { echo "skipped: recipes/tiny.lua is missing"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The fields a resumed run must reproduce: "step":N,"loss":X,"lr":Y,"grad_norm":Z.
fields() { cut -d, -f1-4 "$1"; }

for zero in 0 1; do
  dir="$work/ckpt_zero$zero" full="$work/full_zero$zero.jsonl" resumed="$work/resumed_zero$zero.jsonl"
  common=(--set train.steps=12 --set parallel.data_parallel_size=2
          --set parallel.zero_stage=$zero --set checkpoint.dir="$dir" --set checkpoint.every=6)
  if ! mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" "${common[@]}" \
       --set log.metrics_file="$full" >"$work/full.log" 2>&1; then
    echo "FAIL: the uninterrupted run (zero_stage=$zero) failed:"; cat "$work/full.log"; exit 1
  fi
  for want in shard_00000.safetensors shard_00001.safetensors index.json; do
    [ -f "$dir/step_000006/$want" ] ||
      { echo "FAIL: the checkpoint (zero_stage=$zero) has no $want"; ls -R "$dir"; exit 1; }
  done
  rm -rf "$dir/step_000012"
  echo step_000006 >"$dir/latest"
  head -n 7 "$full" >"$resumed"        # the crashed run had logged steps 1..7
  if ! mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" "${common[@]}" \
       --set checkpoint.resume=true --set log.metrics_file="$resumed" >"$work/resumed.log" 2>&1; then
    echo "FAIL: the resumed run (zero_stage=$zero) failed:"; cat "$work/resumed.log"; exit 1
  fi
  grep -q "resumed from $dir/step_000006 at step 6" "$work/resumed.log" ||
    { echo "FAIL: no 'resumed from' line:"; cat "$work/resumed.log"; exit 1; }
  if ! diff <(fields "$full") <(fields "$resumed"); then
    echo "FAIL: zero_stage=$zero: the resumed run differs from the uninterrupted one"; exit 1
  fi
  [ "$(wc -l <"$resumed")" -eq 12 ] || { echo "FAIL: expected 12 metrics records"; exit 1; }
  echo "zero_stage=$zero: steps 7..12 after resuming match the uninterrupted run"
done
# Each rank reads only its share (plain DP: its slices, broadcast to the other; ZeRO: its
# shards) and checks only the blocks of the files that hold them: a byte changed in the
# middle of a shard file (read by one rank alone) must still stop the resume, with one
# line naming the file and the bytes, not a hang of the rank that waits for its share.
for zero in 0 1; do
  file="$work/ckpt_zero$zero/step_000006/shard_00001.safetensors"
  pos=$(($(stat -c %s "$file") / 2))
  old=$(od -An -tu1 -j "$pos" -N1 "$file" | tr -d ' ')
  printf "\\$(printf %03o $(((old + 1) % 256)))" | dd of="$file" bs=1 seek="$pos" conv=notrunc 2>/dev/null
  if timeout -k 10 120 mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" \
       --set train.steps=12 --set parallel.data_parallel_size=2 --set parallel.zero_stage=$zero \
       --set checkpoint.dir="$work/ckpt_zero$zero" --set checkpoint.resume="${file%/*}" \
       >"$work/corrupt.log" 2>&1; then
    echo "FAIL: the resume (zero_stage=$zero) from a changed shard file succeeded"; exit 1
  fi
  grep -q "$file is corrupt (CRC-32C [0-9a-f]* of bytes" "$work/corrupt.log" ||
    { echo "FAIL: the changed shard file was not named:"; cat "$work/corrupt.log"; exit 1; }
  echo "a byte changed in a shard file stops the zero_stage=$zero resume, naming the file"
done
echo PASS
