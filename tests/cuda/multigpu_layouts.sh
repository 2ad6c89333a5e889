#!/usr/bin/env bash
# tests/cuda/multigpu_layouts.sh TETRA — parallel layouts on GPUs against one CPU process:
# rows of tests/dist/layouts.txt, each run by tools/compare_loss with train.device=cuda
# added to the distributed side only, so that every rank computes on a GPU of its own and
# every collective goes through NCCL, while the reference is the CPU engine in one
# process. Loss and gradient norm (before clipping) must agree at every step within the
# bounds below, set from the differences measured on the emulated device (the CUDA
# kernels and cuBLASLt's products in another order than the CPU's). The first
# TETRA_TEST_STEPS steps of each row are run (default 6; a row with fewer keeps its own).
# TETRA_TEST_CASES=REGEX picks rows by name. Exit 77 (skip) without a CUDA build with
# NCCL, mpirun, or as many GPUs as the largest row picked has ranks.
set -euo pipefail
TETRA=${1:?usage: multigpu_layouts.sh /path/to/tetra}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
command -v mpirun > /dev/null || { echo "SKIP: no mpirun"; exit 77; }
source "$(dirname "$0")/need_gpus.bash"

# name | bounds: loss, grad_norm (relative, every step)
CASES="
dp2                 | 1e-4 1e-4
tp2                 | 1e-4 1e-4
cp2                 | 1e-4 1e-4
pp2_1f1b            | 1e-4 1e-4
llama_tp2_sp        | 1e-4 1e-4
llama_tp2_vocab255  | 1e-4 1e-4
llama_pp2_v2_interleaved | 1e-4 1e-4
llama_tp2_bf16      | 1e-3 1e-2
llama_cp2_bf16      | 1e-3 1e-2
llama_tp2_fp8       | 1e-3 1e-2
guide_dp2_tp2_pp2   | 1e-3 1e-2
llama_tp2_dp2_zero3 | 1e-4 1e-4
off_dp2_zero2_accum2 | 1e-4 1e-4
"
steps=${TETRA_TEST_STEPS:-6}
pick=${TETRA_TEST_CASES:-.}

rows=()
most=0
while IFS='|' read -r name bounds; do
  name=$(echo "$name" | xargs)
  [ -n "$name" ] || continue
  [[ "$name" =~ $pick ]] || continue
  row=$(awk -F'|' -v n="$name" '$0 !~ /^#/ { x = $1; gsub(/ /, "", x); if (x == n) print }' \
        "$ROOT/tests/dist/layouts.txt")
  [ -n "$row" ] || { echo "FAIL: no row $name in tests/dist/layouts.txt"; exit 1; }
  np=$(echo "$row" | cut -d'|' -f2 | xargs)
  [ "$np" -gt "$most" ] && most=$np
  rows+=("$name|$bounds|$row")
done <<< "$CASES"
[ ${#rows[@]} -gt 0 ] || { echo "FAIL: TETRA_TEST_CASES=$pick picks no case"; exit 1; }
need_gpus "$TETRA" "$most"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT"
fails=0
for r in "${rows[@]}"; do
  IFS='|' read -r name bounds _ np recipe layout common _ <<< "$r"
  read -r tol gtol <<< "$bounds"
  np=$(echo "$np" | xargs) recipe=$(echo "$recipe" | xargs)
  args=(--tetra "$TETRA" --np "$np" --tol "$tol" --gtol-early "$gtol" --gtol "$gtol"
        --layout train.device=cuda --out "$WORK/$name")
  for kv in $layout; do [ "$kv" = "-" ] || args+=(--layout "$kv"); done
  sets=()
  row_steps=""
  for kv in $common; do
    [ "$kv" = "-" ] && continue
    case "$kv" in train.steps=*) row_steps=${kv#train.steps=}; continue ;; esac
    sets+=(--set "$kv")
  done
  n=$steps
  [ -n "$row_steps" ] && [ "$row_steps" -lt "$n" ] && n=$row_steps
  start=$(date +%s)
  if out=$(timeout -k 10 240 tools/compare_loss "${args[@]}" "$recipe" "${sets[@]}" \
             --set train.steps="$n" 2>&1); then
    echo "ok   $name ($np GPUs, $n steps, $(( $(date +%s) - start )) s): $(echo "$out" | tail -n 1)"
  else
    echo "FAIL $name ($np GPUs, $n steps):"
    echo "$out" | tail -n 15
    tail -n 15 "$WORK/$name/distributed.log" 2>/dev/null || true
    fails=1
    [ -n "${TETRA_TEST_STOP_AT_FAILURE:-}" ] && break
  fi
done
[ $fails -eq 0 ] && echo PASS || { echo FAIL; exit 1; }
