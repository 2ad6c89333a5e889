# Sourced by the multi-rank test scripts (tests/dist/*.sh) after their header comment:
#   source "$(dirname "$0")/prelude.bash"
# Sets tetra (the binary, the script's first argument), root (the repository, the
# working directory from here on) and work (a temporary directory removed on exit); one
# OpenMP thread per rank. Without mpirun the script is skipped (exit 77), except under
# CI=true, where that is a failure.
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
if ! command -v mpirun >/dev/null; then
  [ "${CI:-}" = true ] && { echo "FAIL: no mpirun (CI=true)"; exit 1; }
  echo "skipped: no mpirun"; exit 77
fi
cd "$root" || exit 1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
# stop_if_failed, called by a script before each of its cases: under
# TETRA_TEST_STOP_AT_FAILURE=1 (tools/mutate sets it: one failure is all a mutant needs)
# the script ends, failed, once a case has set status to non-zero; otherwise nothing.
stop_if_failed() {
  [ -n "${TETRA_TEST_STOP_AT_FAILURE:-}" ] && [ "${status:-0}" != 0 ] && exit 1
  return 0
}
# wanted NAME, before a case of a script that names its cases: whether to run it.
# TETRA_TEST_CASES, when set (tools/mutate sets it for a mutant that one case of a long
# script catches), is an extended regular expression that a case's whole name must match;
# unset, every case runs. A filter that matches no case runs none, and the script passes:
# a mutant then survives, and says so.
wanted() {
  [ -z "${TETRA_TEST_CASES:-}" ] && return 0
  [[ "$1" =~ ^(${TETRA_TEST_CASES})$ ]]
}
