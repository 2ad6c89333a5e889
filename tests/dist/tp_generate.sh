#!/usr/bin/env bash
# Generation with a split model: the tiny Llama (vocabulary 255, which 2 and 4 do not
# divide: the last rank holds fewer rows) trained 3 steps, then 12 tokens generated
# greedily, must give the same tokens on one process, with tp 2, tp 4 and tp 2 x cp 2
# (the split logits gathered back to the whole vocabulary).
# Usage: bash tp_generate.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
script="$root/tests/dist/tp_generate.lua"
common=(--set model.vocab_size=255 --set train.warmup_steps=1)
ids() {   # ids NP settings... -> the "ids: ..." line
  local np="$1"; shift
  local out
  if [ "$np" = 1 ]; then out="$("$tetra" run "$script" "${common[@]}" "$@" 2>&1)"
  else out="$(timeout -k 10 120 mpirun --oversubscribe -np "$np" "$tetra" run "$script" "${common[@]}" "$@" 2>&1)"; fi
  grep '^ids:' <<<"$out" || { echo "no ids from np=$np $*:"; echo "$out" | tail -n 20; }
}
want="$(ids 1)"
echo "one process: $want"
[[ "$want" == ids:* ]] || { echo "FAIL: the single-process run gave no tokens"; exit 1; }
status=0
for layout in "2 parallel.tensor_parallel_size=2" "4 parallel.tensor_parallel_size=4" \
              "4 parallel.tensor_parallel_size=2 parallel.context_parallel_size=2"; do
  set -- $layout
  np="$1"; shift
  sets=(); for kv in "$@"; do sets+=(--set "$kv"); done
  got="$(ids "$np" "${sets[@]}")"
  if [ "$got" != "$want" ]; then echo "FAIL: $*: $got"; status=1; else echo "$*: same tokens"; fi
done
[ "$status" = 0 ] && echo PASS
exit "$status"
