#!/usr/bin/env bash
# tetra profile RECIPE --set ...: on a Llama whose head is heavy (an 8192-token vocabulary
# over dim 128: the head and its loss cost about as much as five blocks, so the uniform
# 4,4 split leaves the last of two stages with most of the work), the profiler proposes
# a split with more blocks on the first stage and predicts it faster (about 1.3-1.4x);
# both splits are then trained under mpirun (8-step runs, taking turns) and their
# median step times printed. Whether the measured balanced split beats the uniform one
# is NOT asserted here: on this shared 2-core machine measured gains ranged 0.85-1.59x
# for a predicted 1.3x, so that comparison is tools/bench/profile.sh's (repeated runs,
# medians), not a test's. The table has every part; the blocks, alike, time alike. Bad
# usage is one line and exit 2; a config error is `tetra run`'s line.
# Usage: bash profile.sh /path/to/tetra
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
here="$(cd "$(dirname "$0")" && pwd)"
recipe="$here/../../recipes/llama.lua"
fail() { echo "FAIL: $*"; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
command -v mpirun >/dev/null || fail "no mpirun"

sets=(--set model.dim=128 --set model.n_layers=8 --set model.n_heads=4 --set model.n_kv_heads=4
      --set model.ffn_hidden=256 --set model.vocab_size=8192 --set model.seq_len=64
      --set train.batch_size=8 --set train.gradient_accumulation_steps=4
      --set parallel.pipeline_parallel_size=2 --set train.threads=1)

# The machine is shared: more tries when a neighbour's burst spoils a measurement. A
# profiler that proposes the uniform split or a slower one fails them all. The ranks are
# not bound to cores: bound (Open MPI's default for 2 ranks), each stage runs as fast as
# its core's other jobs let it, and that, not the split, decided which was faster here.
attempt() {
  "$tetra" profile "$recipe" "${sets[@]}" --reps 5 --measure-steps 8 --measure-rounds 1 \
    --launcher "mpirun --oversubscribe --bind-to none" >"$tmp/out" 2>"$tmp/err" ||
    fail "profile exit $?: $(cat "$tmp/err")"
  cat "$tmp/out"
  for p in embedding layers.0 layers.7 "head + loss" all; do
    grep -q "^$p  " "$tmp/out" || fail "no row for $p"
  done
  # The eight blocks are alike: their forward + backward within 3x of each other (each
  # the fastest of 5, on a busy machine).
  awk '/^layers\./ { t[n++] = $4 } END { lo = t[0]; hi = t[0]
       for (i in t) { if (t[i] < lo) lo = t[i]; if (t[i] > hi) hi = t[i] }
       exit !(n == 8 && hi < 3 * lo) }' "$tmp/out" || fail "the blocks' times differ by over 3x"
  split=$(sed -n 's/^paste: --set parallel.pipeline_stages=\([0-9,]*\) .*/\1/p' "$tmp/out")
  [ -n "$split" ] || fail "no split proposed"
  [ "$split" != "4,4" ] || fail "proposed the uniform split 4,4"
  first=${split%%,*}
  [ "$first" -gt 4 ] || fail "proposed $split: the first stage should take more blocks"
  grep -q "^predicted: the balanced split is 1\.[1-9][0-9]x" "$tmp/out" ||
    fail "predicted gain below 1.1x"
  local u b
  u=$(sed -n 's/^measured uniform .* median step \([0-9.]*\) ms.*/\1/p' "$tmp/out")
  b=$(sed -n 's/^measured balanced .* median step \([0-9.]*\) ms.*/\1/p' "$tmp/out")
  [ -n "$u" ] && [ -n "$b" ] || fail "no measured step times"
  awk -v u="$u" -v b="$b" 'BEGIN { exit !(u > 0 && b > 0) }' || fail "measured step times $u, $b"
  echo "measured: uniform 4,4 $u ms, balanced $split $b ms (not asserted: tools/bench/profile.sh)"
}
attempt

bad() {   # expected message, then the arguments
  local want="$1"; shift
  "$tetra" profile "$@" >"$tmp/bad.out" 2>"$tmp/bad.err"
  local rc=$?
  [ "$rc" -eq 2 ] || fail "profile $*: exit $rc, want 2"
  [ "$(wc -l < "$tmp/bad.err")" -eq 1 ] || fail "profile $*: $(cat "$tmp/bad.err")"
  grep -qF -- "$want" "$tmp/bad.err" || fail "profile $*: '$(cat "$tmp/bad.err")' lacks '$want'"
}
bad "needs a RECIPE" --no-measure
bad "cannot read nowhere.lua" nowhere.lua
bad "--reps needs a whole number of at least 1, got 'x'" "$recipe" --reps x
bad "unknown option '--fast'" "$recipe" --fast
config_error() {   # expected message, then the --set values: exit 1, one line
  local want="$1"; shift
  "$tetra" profile "$recipe" "$@" --no-measure >"$tmp/bad.out" 2>"$tmp/bad.err"
  local rc=$?
  [ "$rc" -eq 1 ] && [ "$(wc -l < "$tmp/bad.err")" -eq 1 ] && grep -qF -- "$want" "$tmp/bad.err" ||
    fail "profile $*: exit $rc, '$(cat "$tmp/bad.err")' (want one line with '$want')"
}
config_error "model.n_layers (2) must be at least parallel.pipeline_parallel_size" \
  --set model.n_layers=2 --set parallel.pipeline_parallel_size=4
config_error "unknown key 'model.unknown_key'" --set model.unknown_key=1
# A launcher that fails: one line naming the split's run and why.
OMP_NUM_THREADS=1 "$tetra" profile "$here/../../recipes/tiny.lua" --set model.n_layers=4 \
  --set model.vocab_size=16384 --set parallel.pipeline_parallel_size=2 --reps 1 \
  --launcher false >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 1 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] &&
  grep -q "the run with parallel.pipeline_stages=2,2 failed (false -np 2 .*): exit status 1, no output" "$tmp/err" ||
  fail "a failing launcher: exit $rc, $(cat "$tmp/err") $(tail -3 "$tmp/out")"
# Under mpirun it refuses (it launches mpirun itself).
# (Both ranks say it, and their lines may interleave: the message is looked for anywhere.)
if mpirun --oversubscribe -np 2 "$tetra" profile "$recipe" >"$tmp/out" 2>&1; then
  fail "under mpirun: it ran"
fi
grep -q "run it as one process (it starts mpirun itself" "$tmp/out" || fail "under mpirun: $(head -3 "$tmp/out")"
! grep -q "fastest of" "$tmp/out" || fail "under mpirun: it profiled before refusing"
echo "PASS profile"
