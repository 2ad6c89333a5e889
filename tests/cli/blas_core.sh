#!/usr/bin/env bash
# OpenBLAS's kernels (issue 31): tetra names the core the CPU's cpuid warrants before
# OpenBLAS starts, `tetra --version` says which core runs and who chose it, a core weaker
# than the CPU (here forced with OPENBLAS_CORETYPE=Prescott) gets one warning line on
# stderr (rank 0 only), and a plain run prints nothing on stderr. Needs an AVX2+FMA CPU
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

# Under a launcher, only rank 0 warns.
out="$(OMPI_COMM_WORLD_RANK=1 OPENBLAS_CORETYPE=Prescott "$tetra" -e 'print("ran")' 2>&1)"
[ "$out" = ran ] || fail "rank 1 printed: $out"
echo PASS
