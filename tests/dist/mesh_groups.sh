#!/usr/bin/env bash
# The 4D mesh from Lua on 4 ranks (tp = 2 x dp = 2) in the default order and with dp
# fastest: group sizes and ranks, collectives, async handles and a differentiable
# collective checked against values computed from the ranks (mesh_groups.lua).
# Usage: bash mesh_groups.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
here="$(cd "$(dirname "$0")" && pwd)"
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
for order in tp-cp-dp-pp dp-tp-cp-pp; do
  TT_ORDER="$order" timeout -k 10 120 mpirun --oversubscribe -np 4 -x TT_ORDER \
    "$tetra" run "$here/mesh_groups.lua" || exit 1
done
