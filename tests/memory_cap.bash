# Sourced by the tests that cap a run's memory, with the tetra binary:
#   source "$root/tests/memory_cap.bash" "$tetra"
# cap_memory KB CMD...: runs CMD with its memory capped at KB kilobytes, as its address
# space (ulimit -v). A tetra built with AddressSanitizer (tools/test --sanitize) cannot
# start under such a cap (ASan reserves terabytes of address space for its shadow): there
# the cap is on resident memory instead (ASan's hard_rss_limit_mb, which ends the process,
# failing the test, once it holds more), and the test says so when it starts.
# asan_build: whether the binary is such a build.
tetra_asan=0
if ldd "${1:?usage: source memory_cap.bash TETRA}" 2>/dev/null | grep -q 'libasan'; then
  tetra_asan=1
  echo "note: $1 is an AddressSanitizer build: this test's memory caps are on resident memory"
fi
asan_build() { [ "$tetra_asan" = 1 ]; }
cap_memory() {
  local kb=$1
  shift
  if asan_build; then
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}hard_rss_limit_mb=$((kb / 1024))" "$@"
  else
    (ulimit -v "$kb" && "$@")
  fi
}
