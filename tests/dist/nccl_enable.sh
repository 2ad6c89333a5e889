#!/usr/bin/env bash
# NCCL communicators are made eagerly (tt_dist_nccl_enable, then with each group), never
# at a first collective. What a machine without a GPU can check, on 2 ranks: groups made
# before the call have no communicator; the call is collective and, where NCCL cannot run
# (a build without NCCL, or no GPU), fails promptly on every rank with one line naming the
# world group, instead of hanging; the CPU groups and their collectives still work after
# it. tests/cuda/multigpu_nccl_groups.sh checks the working case on 4 GPUs.
# Usage: bash nccl_enable.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
out=$(timeout -k 10 60 mpirun --oversubscribe -np 2 "$tetra" -e '
  local ffi = require("ffi")
  local tetra = require("tetra")
  local dist = require("tetra.dist")
  local C = ffi.C
  local mesh = dist.init({ parallel = { data_parallel_size = 2 } })
  assert(C.tt_comm_has_nccl(mesh.dp._c) == 0, "a CPU group got an NCCL communicator")
  local rc = C.tt_dist_nccl_enable()
  local msg = ffi.string(C.tt_last_error())
  assert(rc ~= 0, "tt_dist_nccl_enable succeeded on a machine that cannot run NCCL")
  assert(msg:find("group world", 1, true) and not msg:find("\n"), "message: " .. msg)
  print(("rank %d: %s"):format(mesh.rank, msg))
  local t = tetra.full({ 4 }, mesh.rank + 1)
  mesh.dp:all_reduce(t)
  assert(C.tt_tensor_get(t, 3) == 3, "all_reduce after the failed enable")
  print(("rank %d: CPU collectives still work"):format(mesh.rank))' 2>&1)
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: rc $rc (124 or 137: hung)"; exit 1; }
[ "$(grep -c 'CPU collectives still work' <<<"$out")" -eq 2 ] || { echo "FAIL: not both ranks finished"; exit 1; }
echo "PASS"
