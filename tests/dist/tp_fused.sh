#!/usr/bin/env bash
# Fused q/k/v and w1 | w3 GEMMs under tensor parallelism (2 ranks, bf16), with and without
# sequence parallelism: the grouped GEMMs and the one gather in front of each counted on
# the tape, and a few clean steps (tp_fused.lua). Parity with one
# process is the layout table's business (llama_tp2_bf16 and the other bf16 rows).
# Usage: bash tp_fused.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
here="$(cd "$(dirname "$0")" && pwd)"
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
for sp in 0 1; do
  TT_SP="$sp" timeout -k 10 120 mpirun --oversubscribe -np 2 -x TT_SP \
    "$tetra" run "$here/tp_fused.lua" || exit 1
done
