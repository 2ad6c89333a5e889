#!/usr/bin/env bash
# A short run of every libFuzzer target (tools/fuzz/run.sh, 10 s each, ASan + UBSan): the
# JSONL reader, the tokenizer file loaders, the encoder, the safetensors reader, the
# TFRecord reader. A crash
# fails the test and leaves its input in build-fuzz/.
# Usage: bash fuzz_smoke.sh /path/to/tetra   (exit 77: skipped)
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
if ! command -v clang >/dev/null; then
  [ "${CI:-}" = true ] && { echo "FAIL: clang is missing (CI=true; tools/setup installs it)"; exit 1; }
  echo "skipped: no clang"; exit 77
fi
"$root/tools/fuzz/run.sh" 10 2>&1 | grep -E '^== |Done [0-9]+ runs|ERROR|SUMMARY|runtime error|crash-'
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] && echo PASS || echo "FAIL: a fuzz target crashed (exit $rc)"
exit "$rc"
