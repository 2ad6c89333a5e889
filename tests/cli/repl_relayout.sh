#!/bin/bash
# relayout{} in the SPMD REPL under mpirun -np 4: dp=4 -> tp=2 x dp=2 -> tp=2 x pp=2 ->
# dp=4, a few steps in each. Every step's loss, lr and grad norm (as the REPL prints them)
# must equal the single-process run of the same recipe and seed: the state moved between
# layouts intact, and each layout trains as a fresh start in it would. A bad layout is
# refused with the validator's reasons and the session goes on.
TETRA=${1:?usage: repl_relayout.sh /path/to/tetra}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
if ! command -v mpirun >/dev/null; then
  [ "${CI:-}" = true ] && { echo "FAIL: no mpirun (CI=true)"; exit 1; }
  echo "skipped: no mpirun"; exit 77
fi
cd "$SRC" || exit 1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TMPDIR=$work
# Open MPI keeps allocations past MPI_Finalize: a sanitizer build checks these ranks for
# memory errors, not leaks (as tests/dist does).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

"$TETRA" run recipes/tiny.lua --set train.steps=20 --set log.metrics_file="$work/ref.jsonl" \
  >/dev/null 2>&1 || fail "the single-process reference run failed"
"$TETRA" -e '
local json = require("tetra.util.json").decode
for line in io.lines(arg[1]) do
  local r = json(line)
  if r.step <= 9 then
    print(("step %d  loss %.4f  lr %.3g  grad norm %.3g"):format(r.step, r.loss, r.lr, r.grad_norm))
  end
end' "$work/ref.jsonl" >"$work/ref.txt"

out=$(printf '%s\n' 'train_steps(3)' 'relayout{ tp = 2 }' 'train_steps(2)' \
  'relayout{ tp = 2, pp = 2 }' 'train_steps(2)' 'relayout{ tp = 3 }' 'relayout{}' \
  'train_steps(2)' 'model.layers[1].attention.wq.weight:size(0)' |
  timeout -k 10 120 mpirun --oversubscribe -np 4 "$TETRA" -i recipes/tiny.lua \
    --set train.steps=20 --set parallel.data_parallel_size=4 2>&1); rc=$?
[ $rc -eq 0 ] || fail "the session exited $rc: $out"
sed -nE 's/^\[0-3\] (step [0-9]+ .*)$/\1/p' <<<"$out" >"$work/repl.txt"
[ "$(wc -l <"$work/ref.txt")" -eq 9 ] || fail "reference has $(wc -l <"$work/ref.txt") steps, not 9"
diff "$work/ref.txt" "$work/repl.txt" >"$work/diff" || fail "steps differ from the single-process run: $(cat "$work/diff")"
for want in 'tp=1 cp=1 dp=4 pp=1 -> tp=2 cp=1 dp=2 pp=1 at step 3' \
            'tp=2 cp=1 dp=2 pp=1 -> tp=2 cp=1 dp=1 pp=2 at step 5' \
            'tp=2 cp=1 dp=1 pp=2 -> tp=1 cp=1 dp=4 pp=1 at step 7'; do
  grep -qF "[0-3] relayout: $want" <<<"$out" || fail "no 'relayout: $want': $out"
done
grep -qE '^\[0-3\] error: relayout: .*tensor_parallel_size \(3\) must divide model.n_heads' <<<"$out" ||
  fail "relayout{ tp = 3 } was not refused with the validator's reason: $out"
grep -qE '^\[0-3\] 64$' <<<"$out" || fail "after relayout{} the weight is not whole again: $out"
[ -z "$(ls "$work" | grep relayout)" ] || fail "the relayout checkpoint was left behind"

[ $fails -eq 0 ] && echo "repl_relayout: all checks passed"
exit $((fails > 0))
