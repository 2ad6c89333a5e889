#!/usr/bin/env bash
# Checkpoint resume under tensor parallelism on 2 ranks: each rank writes the slices of
# the parameters (and AdamW moments) it holds, with index.json. The tiny Llama recipe
# runs 12 steps saving every 6; then, as if the job had died after step 7, the step-12
# checkpoint goes, `latest` names step 6, and a second mpirun resumes from it. Its
# metrics file must hold steps 1..12 with loss, lr and grad_norm identical (as text) to
# the uninterrupted run's.
# Usage: bash tp2_checkpoint_resume.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ -f "$root/recipes/tiny.lua" ] || { echo "skipped: recipes/tiny.lua is missing"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
export OMP_NUM_THREADS=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

fields() { cut -d, -f1-4 "$1"; }   # "step":N,"loss":X,"lr":Y,"grad_norm":Z

dir="$work/ckpt" full="$work/full.jsonl" resumed="$work/resumed.jsonl"
common=(--set train.steps=12 --set parallel.tensor_parallel_size=2
        --set checkpoint.dir="$dir" --set checkpoint.every=6)
if ! mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" "${common[@]}" \
     --set log.metrics_file="$full" >"$work/full.log" 2>&1; then
  echo "FAIL: the uninterrupted run failed:"; cat "$work/full.log"; exit 1
fi
for f in shard_00000.safetensors shard_00001.safetensors index.json; do
  [ -f "$dir/step_000006/$f" ] || { echo "FAIL: the checkpoint lacks $f"; ls -R "$dir"; exit 1; }
done
grep -q '"dim":1' "$dir/step_000006/index.json" ||
  { echo "FAIL: index.json records no shard split on dim 1 (row-parallel weights)"; exit 1; }
rm -rf "$dir/step_000012"
echo step_000006 >"$dir/latest"
head -n 7 "$full" >"$resumed"        # the crashed run had logged steps 1..7
if ! mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" "${common[@]}" \
     --set checkpoint.resume=true --set log.metrics_file="$resumed" >"$work/resumed.log" 2>&1; then
  echo "FAIL: the resumed run failed:"; cat "$work/resumed.log"; exit 1
fi
grep -q "resumed from $dir/step_000006 at step 6" "$work/resumed.log" ||
  { echo "FAIL: no 'resumed from' line:"; cat "$work/resumed.log"; exit 1; }
if ! diff <(fields "$full") <(fields "$resumed"); then
  echo "FAIL: the resumed run differs from the uninterrupted one"; exit 1
fi
[ "$(wc -l <"$resumed")" -eq 12 ] || { echo "FAIL: expected 12 metrics records"; exit 1; }
echo "PASS: steps 7..12 after resuming under TP=2 match the uninterrupted run"
