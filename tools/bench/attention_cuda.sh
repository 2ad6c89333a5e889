#!/usr/bin/env bash
# tools/bench/attention_cuda.sh BUILD — attention TFLOP/s on the GPU: Tetra's cuDNN path
# and its fallback kernel (BUILD/attention_cuda, tools/bench/attention_cuda.c), then
# PyTorch's scaled_dot_product_attention at the same shapes (bf16, causal, 32 heads of
# 128, fwd+bwd) when python3 has torch with CUDA, and the ratios ours / PyTorch.
# tools/gpu-check runs it as its cudnn_attention stage. The Python site directories are
# handed to Tetra's cuDNN loader (TETRA_PYTHON_SITE), so it finds the wheel PyTorch uses.
set -uo pipefail
BUILD=${1:?usage: tools/bench/attention_cuda.sh BUILD [MAX_T]}
MAX_T=${2:-4096}
if [ -z "${TETRA_PYTHON_SITE:-}" ] && command -v python3 > /dev/null; then
  TETRA_PYTHON_SITE=$(python3 -c 'import site, sys; print(":".join(site.getsitepackages() + [site.getusersitepackages()]))' 2> /dev/null)
  export TETRA_PYTHON_SITE
fi
ours=$("$BUILD/attention_cuda" "$MAX_T")
rc=$?
echo "$ours" | grep -v '^RESULT'
[ "$rc" -eq 0 ] || exit "$rc"
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
  echo "PyTorch with CUDA is not importable: no comparison with PyTorch SDPA"
  exit 0
fi
echo "$ours" | grep '^RESULT' | python3 -c '
import sys, torch
import torch.nn.functional as F
H, D = 32, 128
def timed(fn, reps=7):
    for _ in range(2): fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[reps // 2]
for line in sys.stdin:
    _, B, T, ours_fwd, ours_both = line.split()
    B, T, ours_fwd, ours_both = int(B), int(T), float(ours_fwd), float(ours_both)
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn_like(q)
    flop = 2.0 * B * H * T * T * D
    with torch.no_grad():
        fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    both = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g))
    tf, tb = flop / fwd / 1e9, 3 * flop / both / 1e9
    print(f"attention bf16 PyTorch {torch.__version__} SDPA causal B={B} T={T} {H}x{D}: "
          f"fwd {tf:6.1f} TFLOP/s, fwd+bwd {tb:6.1f} TFLOP/s; Tetra/PyTorch: fwd "
          f"{ours_fwd / tf:.2f}x, fwd+bwd {ours_both / tb:.2f}x")
'
