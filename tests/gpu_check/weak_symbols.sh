#!/usr/bin/env bash
# The engine reaches its CUDA layer through weak references (a build without CUDA links
# without it), and a weak reference pulls nothing out of a static library: an object of
# libtetra_cuda.a that only weak references name is silently left out, and its op reports
# "not available" on a GPU (the first H200 run lost engine/cuda/copy.cu that way, and every
# training step failed at its first strided copy). This checks, without a GPU, that the
# programs that bring CUDA up (tt_cuda_init) resolved every weak tt_* reference. Only the
# collective hooks (tt_comm_*) may stay open, in programs that link no MPI layer.
#   weak_symbols.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: weak_symbols.sh BUILD_DIR}
command -v nm > /dev/null || { echo "FAIL: no nm (binutils) to read the programs' symbols"; exit 1; }
fail=0 n=0
for prog in "$build"/tetra "$build"/cuda_test_* "$build"/gpu_bench "$build"/kernels_cuda \
            "$build"/attention_cuda; do
  [ -x "$prog" ] || continue
  syms=$(nm "$prog") || { echo "FAIL: nm $prog"; fail=1; continue; }
  grep -qE ' T tt_cuda_init$' <<<"$syms" || continue   # no CUDA in this program
  n=$((n + 1))
  allowed='^$'
  [ "${prog##*/}" = tetra ] || allowed='^tt_comm_'
  open=$(awk '$1 == "w" && $2 ~ /^tt_/ { print $2 }' <<<"$syms" | grep -vE "$allowed" | paste -sd ' ')
  if [ -n "$open" ]; then
    echo "FAIL: ${prog##*/} leaves weak references unresolved: $open"
    echo "      (anchor the object that defines them in engine/cuda/kernels_linked.cu)"
    fail=1
  fi
done
if [ "$n" -eq 0 ]; then
  echo "FAIL: no program in $build brings CUDA up (tt_cuda_init): is this a CUDA build?"
  exit 1
fi
[ "$fail" -eq 0 ] && echo "PASS: $n CUDA programs resolve every weak tt_* reference"
exit "$fail"
