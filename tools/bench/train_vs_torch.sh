#!/usr/bin/env bash
# Tetra vs PyTorch 1.13 (CPU) training throughput on the same Llama, in one run:
#   vocab 4096, dim 256, 4 layers, 4 heads, ffn 768, seq 256, batch 8, fp32, AdamW,
#   max_grad_norm 1.0, random tokens.
# Both processes get the same thread count (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
# torch.set_num_threads) and the same OpenBLAS environment (OPENBLAS_CORETYPE is passed
# through as found, or left unset for both).
#
#   tools/bench/train_vs_torch.sh [path/to/tetra] [threads] [steps] [rounds]
#
# Each round runs Tetra then PyTorch; the best round of each counts, so a burst of load
# from other processes hits one round, not the comparison. Prints each run's JSON line,
# then tokens/s of both (median step and best step), their ratios, and the share of the
# measured sgemm peak that Tetra's best step uses.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tetra="${1:-$root/build/tetra}"
threads="${2:-2}"
steps="${3:-10}"
rounds="${4:-2}"
torch_python="${TORCH_PYTHON:-/usr/bin/python3}"

if [[ ! -x "$tetra" ]]; then
  echo "train_vs_torch: no tetra binary at $tetra (pass its path as the first argument)" >&2
  exit 2
fi
if ! "$torch_python" -c "import torch" 2>/dev/null; then
  echo "train_vs_torch: $torch_python cannot import torch (Debian: apt install python3-torch)" >&2
  exit 2
fi

export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads"
echo "threads $threads, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>}," \
     "OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-<unset>}, $steps timed steps, $rounds rounds"

field() {  # field NAME JSON -> the number after "NAME":
  sed -E "s/.*\"$1\": ?([-0-9.eE+]+).*/\1/" <<<"$2"
}
best_tetra="" best_torch=""
for ((r = 1; r <= rounds; r++)); do
  t="$("$tetra" run "$here/train_vs_torch.lua" --set "train.steps=$steps" | tail -n 1)"
  echo "tetra   #$r: $t"
  p="$("$torch_python" "$here/train_vs_torch.py" --threads "$threads" --steps "$steps" | tail -n 1)"
  echo "pytorch #$r: $p"
  if [[ -z "$best_tetra" ]] || awk -v a="$(field tokens_per_s "$t")" \
       -v b="$(field tokens_per_s "$best_tetra")" 'BEGIN { exit !(a > b) }'; then
    best_tetra="$t"
  fi
  if [[ -z "$best_torch" ]] || awk -v a="$(field tokens_per_s "$p")" \
       -v b="$(field tokens_per_s "$best_torch")" 'BEGIN { exit !(a > b) }'; then
    best_torch="$p"
  fi
done

awk -v t="$(field tokens_per_s "$best_tetra")" -v p="$(field tokens_per_s "$best_torch")" \
    -v tb="$(field best_tokens_per_s "$best_tetra")" -v pb="$(field best_tokens_per_s "$best_torch")" \
    -v f="$(field peak_fraction "$best_tetra")" -v pk="$(field sgemm_peak_gflops "$best_tetra")" \
    -v g="$(field achieved_gflops "$best_tetra")" 'BEGIN {
  printf "tokens/s (median step): tetra %.0f, pytorch %.0f, ratio %.2fx\n", t, p, t / p
  printf "tokens/s (best step):   tetra %.0f, pytorch %.0f, ratio %.2fx\n", tb, pb, tb / pb
  printf "tetra best step: %.0f GFLOP/s = %.1f%% of the measured sgemm peak (%.0f GFLOP/s)\n", g, 100 * f, pk
}'
