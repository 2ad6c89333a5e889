#!/usr/bin/env bash
# The OpenMP wait policy: passive unless the user chose one, set before libgomp starts
# (.preinit_array) without re-executing the binary, so the process keeps its name and
# runs under valgrind. libgomp displays PASSIVE for an unset policy too: the spin count
# (0 when passive, 300000 by default) is what tells them apart. Likewise OpenBLAS's
# workers sleep when a GEMM ends (OPENBLAS_THREAD_TIMEOUT=4) unless the user chose a
# timeout: openblas_thread_timeout() answers what OpenBLAS read in its constructor.
# Usage: bash openmp.sh /path/to/tetra
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
fail() { echo "FAIL: $*"; exit 1; }
out="$(env -u OMP_WAIT_POLICY OMP_DISPLAY_ENV=verbose "$tetra" -e 'print(io.open("/proc/self/comm"):read("*l"))' 2>&1)"
grep -q "OMP_WAIT_POLICY = 'PASSIVE'" <<<"$out" || fail "default policy is not passive: $out"
grep -q "GOMP_SPINCOUNT = '0'" <<<"$out" || fail "libgomp did not see the passive policy: $out"
[ "$(tail -n 1 <<<"$out")" = "tetra" ] || fail "the process is not named tetra: $(tail -n 1 <<<"$out")"
out="$(OMP_WAIT_POLICY=active OMP_DISPLAY_ENV=true "$tetra" --version 2>&1)"
grep -q "OMP_WAIT_POLICY = 'ACTIVE'" <<<"$out" || fail "the user's policy was overridden: $out"
probe='local ffi = require("ffi"); ffi.cdef("int openblas_thread_timeout(void);")
print(ffi.C.openblas_thread_timeout(), os.getenv("OPENBLAS_THREAD_TIMEOUT"))'
out="$(env -u OPENBLAS_THREAD_TIMEOUT "$tetra" -e "$probe" 2>&1)"
[ "$out" = "$(printf '4\tnil')" ] ||
  fail "OpenBLAS's thread timeout (and the variable after start-up) is not 4 (and unset): $out"
out="$(OPENBLAS_THREAD_TIMEOUT=20 "$tetra" -e "$probe" 2>&1)"
[ "$out" = "$(printf '20\t20')" ] || fail "the user's OpenBLAS thread timeout was overridden: $out"
if ldd "$tetra" | grep -q libasan; then
  echo "note: valgrind left out: $tetra is an AddressSanitizer build (tools/test --sanitize)"
elif command -v valgrind >/dev/null; then
  supp="$(dirname "$0")/valgrind.supp"   # the dynamic loader's own reports, not Tetra's
  out="$(valgrind -q --error-exitcode=9 --suppressions="$supp" "$tetra" --version 2>&1)" ||
    fail "under valgrind: $out"
  grep -q '^tetra ' <<<"$out" || fail "no version under valgrind: $out"
elif [ "${CI:-}" = true ]; then
  fail "valgrind is missing (CI=true)"
fi
echo PASS
