#!/bin/bash
# The REPL with stdin not a terminal: expressions print, statements continue across
# lines, errors do not end the session, each command is timed; -i loads a recipe.
TETRA=${1:?usage: repl.sh /path/to/tetra}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

out=$(printf '%s\n' '1 + 2' 'x = 20' 'for i = 1, 2 do' '  x = x + i' 'end' 'x' \
  'error("oops")' 'nil_function()' '"still here"' '{a = 1, b = {2, 3}}' \
  'tetra.ones(2) * 3' | "$TETRA" 2>&1); rc=$?
[ $rc -eq 0 ] || fail "REPL exited $rc"
lines=$(grep -v '^(' <<<"$out")   # results without the timing lines
expected=$'3\n23\nerror: oops\nerror: stdin:1: attempt to call global \'nil_function\' (a nil value)'
grep -qF "$expected" <<<"$(grep -v -e '^stack traceback' -e '^	' <<<"$lines")" || fail "results were: $out"
grep -q '^still here$' <<<"$out" || fail "session did not survive errors: $out"
grep -q '^{a = 1, b = {2, 3}}$' <<<"$out" || fail "table not printed: $out"
grep -q '^\[3\.0000, 3\.0000\]$' <<<"$out" || fail "tensor not printed: $out"
n_timed=$(grep -cE '^\([0-9.]+ (us|ms|s)\)$' <<<"$out")
[ "$n_timed" -eq 9 ] || fail "expected 9 timed commands, saw $n_timed: $out"

# An error's traceback stops at the user's own chunk: none of the REPL's frames.
out=$(printf '%s\n' 'local function f() error("boom") end f()' | "$TETRA" 2>&1)
grep -q "in function 'f'" <<<"$out" || fail "the user's frames are missing from the traceback: $out"
grep -q 'tetra/repl' <<<"$out" && fail "the REPL's own frames are in the traceback: $out"

out=$(printf '%s\n' 'for i = 1, 3 do' | "$TETRA" 2>&1)
grep -q "incomplete statement" <<<"$out" || fail "unterminated input not reported: $out"

# -i with a recipe: its setup's model and config are in scope, helpers work.
if [ -f "$SRC/recipes/tiny.lua" ]; then
  out=$(printf '%s\n' 'cfg.model.dim' 'model:num_params() > 0' 'probe()' \
    'inspect(model.tok_embeddings)' 'train_steps(1)' | "$TETRA" -i "$SRC/recipes/tiny.lua" \
    --set model.dim=32 2>&1); rc=$?
  [ $rc -eq 0 ] || fail "-i exited $rc: $out"
  grep -q '^32$' <<<"$out" || fail "--set did not reach the session config: $out"
  grep -q '^true$' <<<"$out" || fail "model not in scope: $out"
  grep -qE '^loss [0-9.]+ on ' <<<"$out" || fail "probe() printed no loss: $out"
  grep -qE 'output +\[' <<<"$out" || fail "inspect() showed no activation: $out"
  grep -qE 'grad norm [0-9]' <<<"$out" || fail "inspect() showed no grad norm: $out"
  grep -qE '^step 1 +loss' <<<"$out" || fail "train_steps() printed no step: $out"
  # profile_step(k): the next step, its k longest ops, the update among the regions
  out=$(printf '%s\n' 'train_steps(1)' 'profile_step(40)' 'profile_step(0)' \
    'cfg.train.cuda_graphs = true' 'profile_step()' |
    "$TETRA" -i "$SRC/recipes/tiny.lua" --set model.dim=32 2>&1); rc=$?
  [ $rc -eq 0 ] || fail "profile_step: -i exited $rc: $out"
  grep -qE '^step 2 +loss [0-9.]+; its time op by op \(the host clock\):' <<<"$out" ||
    fail "profile_step() did not profile step 2: $out"
  grep -qE '^tt_linear +fwd +15 ' <<<"$out" || fail "profile_step(): no forward linears: $out"
  grep -qE '^optimizer update +region +1 ' <<<"$out" || fail "profile_step(): no update region: $out"
  grep -qE '^all +[0-9.]+ +100\.0%$' <<<"$out" || fail "profile_step(): no total: $out"
  grep -q 'profile_step(k): k must be a positive whole number, got 0' <<<"$out" ||
    fail "profile_step(0) not refused: $out"
  # (a CUDA-graph session's steps record no ops: refused, as log.op_profile_step is)
  grep -q 'profile_step(): this session.s steps run as a CUDA graph' <<<"$out" ||
    fail "profile_step() under train.cuda_graphs not refused: $out"
  # sample(p, n): the prompt and n more tokens (bytes here); bad arguments and
  # a run without text refused with a line each.
  text=$(mktemp)
  for i in $(seq 50); do echo "the quick brown fox jumps over the lazy dog, line $i"; done >"$text"
  out=$(printf '%s\n' 'train_steps(30)' 'sample("the q", 12)' 'sample(nil, 0)' 'sample(3)' |
    "$TETRA" -i "$SRC/recipes/tiny.lua" --set data.mock=false --set data.input_path="$text" \
    --set train.temperature=0 2>&1); rc=$?
  rm -f "$text"
  [ $rc -eq 0 ] || fail "sample: -i exited $rc: $out"
  # (after 30 steps on this text the 12 bytes are letters and spaces: one line)
  line=$(grep '^the q' <<<"$out")
  [ "${#line}" = 17 ] || fail "sample(\"the q\", 12) printed no line of the prompt and 12 bytes: $out"
  grep -q '^error: sample(prompt, n): n must be a positive whole number, got 0$' <<<"$out" ||
    fail "sample(nil, 0) not refused: $out"
  grep -q '^error: sample(prompt, n): prompt must be a string, got number$' <<<"$out" ||
    fail "sample(3) not refused: $out"
  out=$(printf '%s\n' 'sample("x")' | "$TETRA" -i "$SRC/recipes/tiny.lua" 2>&1)
  grep -q '^error: sample(): this run reads no text, so it has no tokenizer' <<<"$out" ||
    fail "sample() without a tokenizer not refused: $out"
fi

out=$("$TETRA" -i /nonexistent/recipe.lua </dev/null 2>&1); rc=$?
[ $rc -eq 1 ] || fail "-i on a missing file exited $rc"

[ $fails -eq 0 ] && echo "repl: all checks passed"
exit $((fails > 0))
