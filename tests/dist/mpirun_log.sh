#!/usr/bin/env bash
# Under mpirun the progress goes to a file as plain lines (Open MPI hands each rank a
# pseudo-terminal, which is no reason to redraw): no carriage returns or escape
# sequences, a line at step 1, every log.every steps and at the last, then the closing
# summary line.
# Usage: bash mpirun_log.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
mpirun --oversubscribe -np 2 "$tetra" run recipes/tiny.lua --set parallel.data_parallel_size=2 \
  --set train.steps=5 --set log.every=2 >"$work/out.log" 2>&1 ||
  { echo "FAIL: the run failed:"; cat "$work/out.log"; exit 1; }
if grep -q $'\r\|\033' "$work/out.log"; then
  echo "FAIL: carriage returns or escape sequences in the log:"; cat -A "$work/out.log" | head; exit 1
fi
steps=$(grep -o '^step [0-9]*/5' "$work/out.log" | tr '\n' ' ')
[ "$steps" = "step 1/5 step 2/5 step 4/5 step 5/5 " ] ||
  { echo "FAIL: progress lines '$steps', want steps 1, 2, 4 and 5:"; cat "$work/out.log"; exit 1; }
grep -q '^done: 5 steps in .* tokens/s, loss ' "$work/out.log" ||
  { echo "FAIL: no closing summary line:"; cat "$work/out.log"; exit 1; }
echo PASS
