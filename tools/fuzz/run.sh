#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for SECONDS
# (default 60); exits non-zero when one finds a crash (its input lands in build-fuzz/).
# Usage: tools/fuzz/run.sh [SECONDS] [TARGET...]
# Targets: fuzz_jsonl (JSONL reader's JSON), fuzz_tokenizer_file (tokenizer.json and
# tiktoken loaders), fuzz_encode (pre-tokenizer, encoder, decoder round trip),
# fuzz_safetensors (the safetensors reader on hostile headers: shapes whose sizes wrap,
# offsets, dtypes), fuzz_tfrecord (the TFRecord reader: framing, checksums, alignment from
# any byte, tf.train.Example decoding). Executions per second on this 2-core machine: jsonl ~125k, safetensors
# ~12k, encode ~6k, tokenizer_file ~3k; a documented run of 10^6 each (2026-12-01, no
# crash): tools/fuzz/run.sh 400 fuzz_tokenizer_file; tools/fuzz/run.sh 180 fuzz_encode;
# tools/fuzz/run.sh 120 fuzz_safetensors; tools/fuzz/run.sh 15 fuzz_jsonl.
# tests/cli/fuzz_smoke.sh runs each for 10 s in CI.
set -euo pipefail
secs="${1:-60}"; shift || true
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$root/build-fuzz"
mkdir -p "$out"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_jsonl fuzz_tokenizer_file fuzz_encode fuzz_safetensors fuzz_tfrecord)
data_srcs=("$root"/engine/data/{unicode,unicode_tables,bpe,bpe_load}.c "$root"/engine/common/*.c)
# The tensor engine on the CPU (no MPI, no CUDA): what the safetensors reader builds on,
# less the modules that need MPI, libmicrohttpd or the data library (nothing the reader
# reaches; a new engine file that does not link here belongs in this list).
engine_srcs=()
for f in "$root"/engine/{core,common,ops,optim,io}/*.c "$root"/kernels/cpu/*.c; do
  case "$f" in */ops/vocab_parallel.c|*/ops/fp8.c|*/io/ckpt_writer.c) ;; *) engine_srcs+=("$f") ;; esac
done
# Every source is compiled once, to an object under build-fuzz/obj that the targets share,
# all with the same flags (the tensor engine's OpenMP and OpenBLAS headers); each target
# links the objects it needs.
blas_cflags=$(pkg-config --cflags openblas)
compile() {   # compile SRC...: their objects in objs, each compiled when not yet there
  local src obj todo=()
  objs=()
  for src in "$@"; do
    obj="$out/obj/$(realpath --relative-to="$root" "$src" | tr / _).o"
    objs+=("$obj")
    [ -f "$obj" ] || todo+=("$src" "$obj")
  done
  [ ${#todo[@]} -gt 0 ] || return 0
  mkdir -p "$out/obj"
  # (pairs: a source, its object)
  printf '%s\0' "${todo[@]}" | ROOT=$root BLAS=$blas_cflags xargs -0 -n 2 -P "$(nproc)" \
    sh -c 'clang -std=gnu11 -g -O1 -fsanitize=fuzzer-no-link,address,undefined \
             -fno-sanitize-recover=undefined -fopenmp -I"$ROOT/engine" -I"$ROOT/kernels" \
             -I"$ROOT/kernels/cpu" $BLAS -c "$1" -o "$2"' sh
}
rm -rf "$out/obj"   # (sources may have changed since the last run)
for t in "${targets[@]}"; do
  srcs=("${data_srcs[@]}")
  extra=(-lpthread -lm)
  if [ "$t" = fuzz_tfrecord ]; then
    srcs+=("$root"/engine/data/{docs,shards,s3}.c "$root/engine/io/checksum.c")
  fi
  if [ "$t" = fuzz_safetensors ]; then
    srcs=("${engine_srcs[@]}")
    extra=($(pkg-config --libs openblas) -lm -lpthread)
  fi
  compile "${srcs[@]}"
  clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -fopenmp -I"$root/engine" -I"$root/kernels" "$root/tools/fuzz/$t.c" "${objs[@]}" \
    "${extra[@]}" -o "$out/$t"
  mkdir -p "$out/corpus_$t"
  # A valid file to start from (random bytes rarely pass TFRecord's checksums).
  [ "$t" = fuzz_tfrecord ] && cp "$root/tests/fixtures/fuzz_seed.tfrecord" "$out/corpus_$t/seed"
  echo "== $t ($secs s)"
  # Crash inputs land in build-fuzz/ (artifact_prefix), never in the work tree.
  "$out/$t" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 \
    -artifact_prefix="$out/" "$out/corpus_$t"
done
