#!/usr/bin/env bash
# The quick-start job (tools/demo runs recipes/demo.lua) as the README promises it, cut to
# a few steps: it learns its BPE vocabulary from the fortunes and the King James Bible,
# trains, evaluates on the held-out text, prints a sample and the "done:" line, and its
# loss falls. (A change to the training loop broke this job once while every other test
# passed: data sources that create their loader lazily.)
# Usage: bash demo.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ ! -d /usr/share/games/fortunes ] || ! command -v bible >/dev/null 2>&1; then
  [ "${CI:-}" = true ] && { echo "FAIL: the demo corpus is missing (CI=true; tools/setup installs fortunes and bible-kjv-text)"; exit 1; }
  echo "skipped: no fortunes / bible-kjv-text"; exit 77
fi
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
if ! "$tetra" run "$root/recipes/demo.lua" --set train.steps=8 --set train.warmup_steps=2 --set train.eval_every=4 \
     --set train.sample_tokens=16 >"$out" 2>&1; then
  cat "$out"; echo "FAIL: the demo recipe failed"; exit 1
fi
cat "$out"
line=$(grep -E '^done: 8 steps' "$out") || { echo "FAIL: no 'done: 8 steps' line"; exit 1; }
grep -q "eval loss" <<<"$line" || { echo "FAIL: no eval loss in '$line'"; exit 1; }
awk '{ for (i = 1; i <= NF; i++) if ($i == "->") { a = $(i - 1); b = $(i + 1) } }
     END { sub(",", "", b); exit !(b + 0 < a + 0) }' <<<"$line" ||
  { echo "FAIL: the loss did not fall: $line"; exit 1; }
echo PASS
