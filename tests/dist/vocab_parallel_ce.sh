#!/usr/bin/env bash
# Vocab-parallel cross-entropy (tetra.parallel.tensor, engine/ops/vocab_parallel.c) on 1,
# 2 and 3 ranks: loss and gradients of each rank's vocabulary columns against a float64
# reference of the plain cross-entropy (vocab_parallel_ce.lua).
# Usage: bash vocab_parallel_ce.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
here="$(cd "$(dirname "$0")" && pwd)"
timeout -k 10 60 "$tetra" run "$here/vocab_parallel_ce.lua" || exit 1
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
for np in 2 3; do
  timeout -k 10 120 mpirun --oversubscribe -np "$np" "$tetra" run "$here/vocab_parallel_ce.lua" ||
    exit 1
done
