#!/usr/bin/env bash
# tests/cuda/multigpu_nccl_groups.sh TETRA — NCCL communicators are made eagerly, in one
# order on every rank. Four ranks on four GPUs, laid out tp 2 x pp 2: right after
# tetra.dist.init every group of two has its communicator, before any collective. Then
# each rank starts an all-reduce on its tp group and one on its pp group, the odd tp ranks
# in the other order, and waits for both. Made lazily at a group's first collective, the
# communicators' set-up would block in a cycle (rank 0 in tp's waiting for rank 1, rank 1
# in pp's waiting for rank 3, rank 3 in tp's waiting for rank 2, rank 2 in pp's waiting
# for rank 0). Both sums must be right. At the exit every rank frees its communicators
# in the order they were made (ncclCommDestroy can wait for the other ranks), world's
# first (TETRA_TEST_LOG_TEARDOWN=1 has each rank say so). Exit 77 (skip) without a CUDA
# build with NCCL, mpirun, or four GPUs.
set -euo pipefail
TETRA=${1:?usage: multigpu_nccl_groups.sh /path/to/tetra}
command -v mpirun > /dev/null || { echo "SKIP: no mpirun"; exit 77; }
source "$(dirname "$0")/need_gpus.bash"
need_gpus "$TETRA" 4

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
set +e
out=$(TETRA_TEST_LOG_TEARDOWN=1 timeout -k 10 120 mpirun --oversubscribe -np 4 -x TETRA_TEST_LOG_TEARDOWN "$TETRA" -e '
  local ffi = require("ffi")
  local tetra = require("tetra")
  local dist = require("tetra.dist")
  local C = ffi.C
  local mesh = dist.init({ parallel = { tensor_parallel_size = 2, pipeline_parallel_size = 2 },
                           train = { device = "cuda" }, dist = { timeout_s = 60 } })
  for _, g in ipairs({ "world", "tp", "pp" }) do
    assert(C.tt_comm_has_nccl(mesh[g]._c) == 1, g .. ": no NCCL communicator after dist.init")
  end
  local host = mesh.world:split(0, mesh.rank, "host", { host_only = true })
  assert(C.tt_comm_has_nccl(host._c) == 0, "a host_only group got an NCCL communicator")
  local r, dev = mesh.rank, require("tetra.train").device("cuda")
  local a = tetra.full({ 1000 }, r + 1, { device = dev })
  local b = tetra.full({ 1000 }, 10 * (r + 1), { device = dev })
  local h = { ffi.new("tt_comm_handle *[1]"), ffi.new("tt_comm_handle *[1]") }
  local jobs = { { mesh.tp, a, h[1] }, { mesh.pp, b, h[2] } }
  if mesh.coords.tp == 1 then jobs = { jobs[2], jobs[1] } end
  for _, j in ipairs(jobs) do
    assert(C.tt_comm_all_reduce_async(j[1]._c, j[2], 0, j[3]) == 0, ffi.string(C.tt_last_error()))
  end
  for i = 1, 2 do
    assert(C.tt_comm_wait(h[i][0]) == 0, ffi.string(C.tt_last_error()))
    C.tt_comm_handle_free(h[i][0])
  end
  local function first(t)
    local box = ffi.new("tt_tensor *[1]")
    assert(C.tt_to_device(t, C.TT_CPU, box) == 0, ffi.string(C.tt_last_error()))
    local v = C.tt_tensor_get(box[0], 999)
    C.tt_tensor_release(box[0])
    return v
  end
  local tp_peer, pp_peer = bit.bxor(r, 1), bit.bxor(r, 2)
  local want_a, want_b = (r + 1) + (tp_peer + 1), 10 * ((r + 1) + (pp_peer + 1))
  assert(first(a) == want_a, ("rank %d: tp sum %g, want %g"):format(r, first(a), want_a))
  assert(first(b) == want_b, ("rank %d: pp sum %g, want %g"):format(r, first(b), want_b))
  print(("rank %d: tp and pp all-reduces right"):format(r))' 2>&1)
rc=$?
set -e
echo "$out"
if grep -q 'need a build with NCCL' <<<"$out"; then echo "SKIP: this tetra was built without NCCL"; exit 77; fi
[ "$rc" -eq 0 ] || { echo "FAIL: 4 ranks, tp and pp all-reduces in crossed orders (rc $rc; 124 or 137: hung)"; exit 1; }
[ "$(grep -c 'all-reduces right' <<<"$out")" -eq 4 ] || { echo "FAIL: not every rank checked its sums"; exit 1; }
for r in 0 1 2 3; do
  made=$(sed -n "s/^tetra: rank $r: freeing group .* (made #\([0-9]*\).*/\1/p" <<<"$out" | tr '\n' ' ')
  first=$(grep -m 1 "^tetra: rank $r: freeing group" <<<"$out" || true)
  if [ "$made" != "$(tr ' ' '\n' <<<"$made" | sed '/^$/d' | sort -n | tr '\n' ' ')" ] ||
     [ "$(wc -w <<<"$made")" -lt 3 ] || ! grep -q "freeing group world (made #1)" <<<"$first"; then
    echo "FAIL: rank $r freed its communicators as #$made (want world's first, then the order made)"
    exit 1
  fi
done
echo "PASS: NCCL communicators made with the groups; crossed-order collectives complete"
