#!/usr/bin/env bash
# log.trace_steps: a pp2 1F1B run traces steps 3 and 4 on both ranks; `tetra trace merge`
# makes one timeline; trace_check.py validates it against the Trace Event Format schema
# (tools/trace/trace-event.schema.json) and checks the 1F1B order of each stage, the
# data-wait and optimizer regions, and that activations arrive after they were sent on
# the aligned clocks. Bad trace_steps and bad merge input are one line each.
# Usage: bash trace.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
fail() { echo "FAIL: $*"; exit 1; }
py=python3
[ -x "$root/.deps/venv/bin/python3" ] && py="$root/.deps/venv/bin/python3"
if ! "$py" -c "import jsonschema" 2>/dev/null; then
  [ "${CI:-}" = true ] && fail "no jsonschema for $py (CI=true; tools/setup-python-refs installs it)"
  echo "skipped: no jsonschema (tools/setup-python-refs)"; exit 77
fi

out="$(timeout -k 10 120 mpirun --oversubscribe -np 2 "$tetra" run recipes/tiny.lua \
        --set parallel.pipeline_parallel_size=2 --set parallel.pipeline_schedule=1f1b \
        --set train.gradient_accumulation_steps=4 --set train.steps=5 \
        --set log.trace_steps=3:4 --set log.trace_dir="$work/trace" 2>&1)" || fail "run: $out"
ls "$work/trace/trace-rank0.json" "$work/trace/trace-rank1.json" >/dev/null || fail "no trace files"
"$tetra" trace merge "$work/all.json" "$work/trace/trace-rank0.json" "$work/trace/trace-rank1.json" \
  || fail "merge"
"$py" "$root/tests/dist/trace_check.py" "$work/all.json" "$root/tools/trace/trace-event.schema.json" \
  3,4 4 || fail "trace_check.py"

err="$("$tetra" run recipes/tiny.lua --set log.trace_steps=5:3 2>&1)" && fail "trace_steps=5:3 accepted"
[ "$(echo "$err" | wc -l)" -eq 1 ] && echo "$err" | grep -q 'log.trace_steps = "5:3"' \
  || fail "trace_steps=5:3: $err"
echo '{"traceEvents":[]}' > "$work/bad.json"
err="$("$tetra" trace merge "$work/x.json" "$work/bad.json" 2>&1)"
[ $? -eq 2 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] && echo "$err" | grep -q "not a trace written by log.trace_steps" \
  || fail "merge of a foreign file: $err"
echo "trace ok"
