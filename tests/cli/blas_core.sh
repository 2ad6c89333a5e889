#!/usr/bin/env bash
# The CPU's matmul libraries (issue 31). OpenBLAS's kernels: tetra names the core the CPU's
# cpuid warrants before OpenBLAS starts, `tetra --version` says which core runs and who
# chose it, a core weaker than the CPU (here forced with OPENBLAS_CORETYPE=Prescott) gets
# one warning line on stderr (rank 0 only), and a plain run prints nothing on stderr. The
# library of the matmul family (oneDNN on Intel AVX-512, else OpenBLAS; TETRA_BLAS wins)
# and of bf16 products (TETRA_BF16_GEMM) as --version reports them, bad names refused in
# one line, and a bf16 run on dot products against the emulation. Needs an AVX2+FMA CPU
# (the AVX-512 choices are tested on canned features in c/test_cpu).
# Usage: bash blas_core.sh /path/to/tetra
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
fail() { echo "FAIL: $*"; exit 1; }
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null) "
[[ "$flags" == *" avx2 "* && "$flags" == *" fma "* ]] || { echo "SKIP: no AVX2+FMA CPU"; exit 77; }
if [[ "$flags" == *" avx512f "* && "$flags" == *" avx512bw "* && "$flags" == *" avx512vl "* ]]
then strong='SkylakeX|Cooperlake|SapphireRapids'
else strong='Haswell|Zen|SkylakeX|Cooperlake|SapphireRapids'
fi

# Unset: the core is chosen from cpuid, reported, not weaker than the CPU, no stderr.
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
out="$(env -u OPENBLAS_CORETYPE "$tetra" --version 2>"$tmp/err")"
err="$(cat "$tmp/err")"
line="$(sed -n 2p <<<"$out")"
want="^OpenBLAS core ($strong) \\(set from cpuid: .*AVX2.*; OPENBLAS_CORETYPE overrides\\)\$"
[[ "$line" =~ $want ]] || fail "--version's core line: '$line'"
[ -z "$err" ] || fail "stderr of a plain run: $err"
# The environment is the user's again once main runs.
got="$(env -u OPENBLAS_CORETYPE "$tetra" -e 'print(os.getenv("OPENBLAS_CORETYPE"))')"
[ "$got" = nil ] || fail "OPENBLAS_CORETYPE left in the environment: $got"

# Forced weak: the user's value wins, and one warning names the core, the CPU and the fix.
out="$(OPENBLAS_CORETYPE=Prescott "$tetra" -e 'print("ran")' 2>&1)"
[ "$(grep -c 'warning: OpenBLAS' <<<"$out")" -eq 1 ] || fail "no single warning: $out"
want="^tetra: warning: OpenBLAS runs its Prescott kernels \\(your OPENBLAS_CORETYPE=Prescott"
want+=" chose them\\) on a CPU with .*AVX2.*: .*the fix: set OPENBLAS_CORETYPE=($strong)\$"
grep -qE "$want" <<<"$out" || fail "the warning line: $out"
grep -qx ran <<<"$out" || fail "the command did not run: $out"
line="$(OPENBLAS_CORETYPE=Prescott "$tetra" --version 2>/dev/null | sed -n 2p)"
[[ "$line" == "OpenBLAS core Prescott (your OPENBLAS_CORETYPE=Prescott; cpuid: "* ]] ||
  fail "the user's core line: '$line'"

# The matmul library: oneDNN chosen on an Intel AVX-512 CPU (c/test_cpu has the rule),
# OpenBLAS elsewhere; the user's TETRA_BLAS wins; an unknown one stops with one line.
line="$(env -u TETRA_BLAS "$tetra" --version | sed -n 3p)"
vendor="$(sed -n 's/^vendor_id[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
if [[ "$vendor" == GenuineIntel && "$flags" == *" avx512f "* && "$flags" == *" avx512bw "* ]]
then lib=onednn; else lib=openblas; fi
[[ "$line" == "CPU matmul products on $lib (chosen for this CPU; TETRA_BLAS=openblas, blis or onednn overrides); bf16 products: emulate (TETRA_BF16_GEMM: emulate or dot)" ]] ||
  fail "--version's library line on this $vendor CPU: '$line'"
line="$(TETRA_BLAS=openblas "$tetra" --version | sed -n 3p)"
[[ "$line" == "CPU matmul products on openblas (your TETRA_BLAS=openblas); "* ]] ||
  fail "the user's TETRA_BLAS: '$line'"
out="$(TETRA_BLAS=mkl "$tetra" -e 'print("ran")' 2>&1)"; rc=$?
[ $rc -eq 2 ] && [ "$out" = "tetra: TETRA_BLAS=mkl is not a library tetra knows: use openblas (the default), blis or onednn" ] ||
  fail "TETRA_BLAS=mkl: rc $rc, '$out'"

# bf16 products: dot where the CPU has AVX512_BF16 (else refused in one line), a bad name
# refused; a short bf16 run gives the emulation's losses to bf16 precision.
out="$(TETRA_BF16_GEMM=fast "$tetra" -e 'print("ran")' 2>&1)"; rc=$?
[ $rc -eq 2 ] && [[ "$out" == "tetra: TETRA_BF16_GEMM=fast is not a choice tetra knows: use emulate (the default) or dot" ]] ||
  fail "TETRA_BF16_GEMM=fast: rc $rc, '$out'"
if [[ "$flags" == *" avx512_bf16 "* ]]; then
  line="$(TETRA_BF16_GEMM=dot "$tetra" --version | sed -n 3p)"
  [[ "$line" == *"; bf16 products: dot (TETRA_BF16_GEMM: emulate or dot)" ]] ||
    fail "TETRA_BF16_GEMM=dot in --version: '$line'"
  losses() {
    "$tetra" run recipes/tiny.lua --set train.steps=4 --set train.precision=bf16 \
      --set log.every=1 2>&1 | sed -n 's/^step [0-9]*\/4 | loss \([0-9.]*\) .*/\1/p' | tr '\n' ' '
  }
  emu="$(cd "$(dirname "$0")/../.." && losses)"
  dot="$(cd "$(dirname "$0")/../.." && TETRA_BF16_GEMM=dot losses)"
  [ "$(wc -w <<<"$emu")" -eq 4 ] || fail "the bf16 run printed no losses: '$emu'"
  awk -v a="$emu" -v b="$dot" 'BEGIN { n = split(a, x, " "); split(b, y, " ");
    for (i = 1; i <= n; i++) if ((x[i] - y[i]) ^ 2 > (0.002 * x[i]) ^ 2) exit 1 }' ||
    fail "bf16 losses, emulate '$emu' against dot '$dot'"
else
  out="$(TETRA_BF16_GEMM=dot "$tetra" -e 'print("ran")' 2>&1)"; rc=$?
  [ $rc -eq 2 ] && [[ "$out" == *"no AVX512_BF16"* ]] || fail "dot without AVX512_BF16: $out"
fi

# Under a launcher, only rank 0 warns.
out="$(OMPI_COMM_WORLD_RANK=1 OPENBLAS_CORETYPE=Prescott "$tetra" -e 'print("ran")' 2>&1)"
[ "$out" = ran ] || fail "rank 1 printed: $out"
echo PASS
