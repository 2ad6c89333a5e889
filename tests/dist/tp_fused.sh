#!/usr/bin/env bash
# Fused q/k/v and w1 | w3 GEMMs under tensor parallelism (2 ranks, bf16), with and without
# sequence parallelism: the grouped GEMMs and the one gather in front of each counted on
# the tape, and a few clean steps (tp_fused.lua); in fp32 the one gather per group, in
# fp8 one per projection.
# Parity with one process is the layout table's business (llama_tp2_bf16 and the other
# rows).
# Usage: bash tp_fused.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
here="$(cd "$(dirname "$0")" && pwd)"
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
for precision in bf16 fp32 fp8; do
  for sp in 0 1; do
    TT_SP="$sp" TT_PRECISION="$precision" timeout -k 10 120 mpirun --oversubscribe -np 2 \
      -x TT_SP -x TT_PRECISION "$tetra" run "$here/tp_fused.lua" || exit 1
  done
done
