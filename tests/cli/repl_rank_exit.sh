#!/bin/bash
# A rank that dies in the SPMD REPL (mpirun -np 4) is named and the job ends, instead of
# rank 0 waiting for its answer forever: one that exits (os.exit(3) on rank 2) and one
# that crashes (a null write on rank 2, SIGSEGV). Both within the timeout, non-zero.
TETRA=${1:?usage: repl_rank_exit.sh /path/to/tetra}
if ! command -v mpirun >/dev/null; then
  [ "${CI:-}" = true ] && { echo "FAIL: no mpirun (CI=true)"; exit 1; }
  echo "skipped: no mpirun"; exit 77
fi
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI keeps allocations past MPI_Finalize: a sanitizer build checks these ranks for
# memory errors, not leaks (as tests/dist does).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

session() {   # session LINE: '%on 2', then LINE, then a line that must never answer
  printf '%s\n' '"r" .. rank' '%on 2' "$1" '"after"' |
    timeout -k 10 60 mpirun --oversubscribe -np 4 "$TETRA" 2>&1
}

out=$(session 'os.exit(3)'); rc=$?
{ [ $rc -ne 124 ] && [ $rc -ne 137 ]; } || fail "the session hung after rank 2 exited: $out"
[ $rc -ne 0 ] || fail "the job ended with status 0 after rank 2 exited"
grep -q '^\[3\] r3$' <<<"$out" || fail "the session did not run before: $out"
grep -q 'rank 2: exited with status 3' <<<"$out" || fail "rank 2's exit is not named: $out"
grep -q 'after' <<<"$out" && fail "a line ran after rank 2 exited: $out"

out=$(session 'require("ffi").cast("int *", 0)[0] = 1'); rc=$?
{ [ $rc -ne 124 ] && [ $rc -ne 137 ]; } || fail "the session hung after rank 2 crashed: $out"
[ $rc -ne 0 ] || fail "the job ended with status 0 after rank 2 crashed"
grep -qE 'process rank 2 .*signal (11|6)' <<<"$out" || fail "rank 2's crash is not named: $out"

[ $fails -eq 0 ] && echo "repl_rank_exit: all checks passed"
exit $((fails > 0))
