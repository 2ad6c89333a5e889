#!/usr/bin/env bash
# Tetra vs PyTorch 1.13 (CPU) training throughput on the same Llama, in one run:
#   vocab 4096, dim 256, 4 layers, 4 heads, ffn 768, seq 256, batch 8, fp32, AdamW,
#   max_grad_norm 1.0, random tokens.
# Both processes get the same thread count (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
# torch.set_num_threads) and the same OpenBLAS environment (OPENBLAS_CORETYPE is passed
# through as found, or left unset for both).
#
#   tools/bench/train_vs_torch.sh [path/to/tetra] [threads] [steps]
#
# Prints each side's JSON line, then tokens/s of both, their ratio and the share of the
# measured sgemm peak a Tetra step uses.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tetra="${1:-$root/build/tetra}"
threads="${2:-2}"
steps="${3:-10}"
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
echo "threads $threads, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>}, $steps timed steps each"

tetra_line="$("$tetra" run "$here/train_vs_torch.lua" --set "train.steps=$steps" | tail -n 1)"
echo "tetra:   $tetra_line"
torch_line="$("$torch_python" "$here/train_vs_torch.py" --threads "$threads" --steps "$steps" | tail -n 1)"
echo "pytorch: $torch_line"

field() {  # field NAME JSON -> the number after "NAME":
  sed -E "s/.*\"$1\": ?([-0-9.eE+]+).*/\1/" <<<"$2"
}
t_tps="$(field tokens_per_s "$tetra_line")"
p_tps="$(field tokens_per_s "$torch_line")"
frac="$(field peak_fraction "$tetra_line")"
peak="$(field sgemm_peak_gflops "$tetra_line")"
awk -v t="$t_tps" -v p="$p_tps" -v f="$frac" -v pk="$peak" 'BEGIN {
  printf "tokens/s: tetra %.0f, pytorch %.0f, ratio %.2fx\n", t, p, t / p
  printf "tetra step: %.1f%% of the measured sgemm peak (%.0f GFLOP/s)\n", 100 * f, pk
}'
