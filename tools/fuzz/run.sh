#!/usr/bin/env bash
# Builds the libFuzzer targets of the data pipeline with clang (ASan + UBSan) and runs
# each for SECONDS (default 60). Usage: tools/fuzz/run.sh [SECONDS] [TARGET...]
# Targets: fuzz_jsonl (JSONL reader's JSON), fuzz_tokenizer_file (tokenizer.json and
# tiktoken loaders), fuzz_encode (pre-tokenizer, encoder, decoder round trip).
set -euo pipefail
secs="${1:-60}"; shift || true
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$root/build-fuzz"
mkdir -p "$out"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_jsonl fuzz_tokenizer_file fuzz_encode)
srcs=("$root"/engine/data/{unicode,unicode_tables,util,json,bpe,bpe_load}.c "$root/engine/error.c")
for t in "${targets[@]}"; do
  clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$root/engine" -I"$root/kernels" "$root/tools/fuzz/$t.c" "${srcs[@]}" -lpthread -o "$out/$t"
  mkdir -p "$out/corpus_$t"
  echo "== $t ($secs s)"
  # Crash inputs land in build-fuzz/ (artifact_prefix), never in the work tree.
  "$out/$t" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 \
    -artifact_prefix="$out/" "$out/corpus_$t"
done
