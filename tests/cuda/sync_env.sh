#!/usr/bin/env bash
# tests/cuda/sync_env.sh TETRA — TETRA_CUDA_SYNC, read by tt_cuda_init before it looks
# for a GPU (so this runs on any machine with a CUDA build): unset or 0 leaves launches
# asynchronous, 1 turns the launch check on, anything else stops tt_cuda_init with one
# line naming the variable and its values. tests/cuda/test_runtime.c checks on a GPU
# that the check reports a faulting kernel at its launch. Exit 77 (skip) in a build
# without CUDA.
set -uo pipefail
TETRA=${1:?usage: sync_env.sh /path/to/tetra}
probe='
  local f = require("tetra.ffi")
  if not (pcall(f.cdef_header, "tetra_cuda.h") and f.has_symbol("tt_cuda_set_sync_launches")) then
    print("SKIP: this tetra was built without CUDA"); os.exit(77)
  end
  local rc = f.C.tt_cuda_init()
  local ffi = require("ffi")
  print(("sync=%d init=%d msg=%s"):format(f.C.tt_cuda_sync_launches(), rc,
        rc ~= 0 and ffi.string(f.C.tt_last_error()) or ""))'
fails=0
check() {   # check VALUE PATTERN: TETRA_CUDA_SYNC=VALUE (unset when "-") prints PATTERN
  local out rc
  if [ "$1" = - ]; then out=$(env -u TETRA_CUDA_SYNC "$TETRA" -e "$probe" 2>&1)
  else out=$(TETRA_CUDA_SYNC=$1 "$TETRA" -e "$probe" 2>&1)
  fi
  rc=$?
  [ "$rc" -eq 77 ] && { echo "$out"; exit 77; }
  grep -qE -- "$2" <<<"$out" || { echo "FAIL: TETRA_CUDA_SYNC=$1: wanted /$2/, got: $out"; fails=$((fails + 1)); }
}
check - '^sync=0 '
check 0 '^sync=0 '
check 1 '^sync=1 '
check yes '^sync=0 init=-1 msg=TETRA_CUDA_SYNC=yes: set it to 1 \(wait for the GPU and check after every kernel launch\) or 0$'
[ "$fails" -eq 0 ] || exit 1
echo "PASS: TETRA_CUDA_SYNC unset, 0, 1 and a bad value"
