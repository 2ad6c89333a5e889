#!/usr/bin/env bash
# Groups are freed at the exit, in the order they were made, on every rank alike: freeing
# an NCCL communicator can wait for its other ranks, so two ranks that free two
# shared ones in opposite orders (each rank's garbage collector picks its own) would wait
# on each other for good. On 2 ranks: four groups are dropped in a different order on
# each rank and collected, a fifth stays referenced; TETRA_TEST_LOG_TEARDOWN=1 has every
# rank say what it frees. Each must free nothing before the exit (os.exit, so that the
# fifth and the mesh's groups are still referenced then), then every group in the order
# made. GPUs are needed to see the hang itself; this checks the
# order, which is the same code for MPI's communicators and NCCL's.
# Usage: bash teardown_order.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
out=$(TETRA_TEST_LOG_TEARDOWN=1 timeout -k 10 60 mpirun --oversubscribe -np 2 \
  -x TETRA_TEST_LOG_TEARDOWN "$tetra" -e '
  local dist = require("tetra.dist")
  local mesh = dist.init({ parallel = { data_parallel_size = 2 } })
  local groups = {}
  for _, name in ipairs({ "a", "b", "c", "d", "kept" }) do
    groups[name] = mesh.world:split(0, mesh.rank, name)
  end
  local order = mesh.rank == 0 and { "d", "b", "a", "c" } or { "a", "c", "d", "b" }
  for _, name in ipairs(order) do
    groups[name] = nil
    collectgarbage()
    collectgarbage()
  end
  io.stderr:write(("tetra: rank %d: dropped every group\n"):format(mesh.rank))
  os.exit(0)   -- (the Lua state stays open: "kept" and the mesh are still referenced)' 2>&1)
rc=$?
echo "$out"
status=0
[ "$rc" -eq 0 ] || { echo "FAIL: exit $rc (124 or 137: hung)"; exit 1; }
for r in 0 1; do
  mine=$(grep "^tetra: rank $r: \(freeing group\|dropped every group\)" <<<"$out")
  if [ "$(head -n 1 <<<"$mine")" != "tetra: rank $r: dropped every group" ]; then
    echo "FAIL: rank $r freed a group before the exit"; status=1
  fi
  made=$(sed -n 's/.*freeing group .* (made #\([0-9]*\).*/\1/p' <<<"$mine" | tr '\n' ' ')
  if [ "$made" != "$(sort -n <<<"$(tr ' ' '\n' <<<"$made" | sed '/^$/d')" | tr '\n' ' ')" ]; then
    echo "FAIL: rank $r freed its groups out of the order made: #$made"; status=1
  fi
  names=$(sed -n 's/.*freeing group \(a\|b\|c\|d\|kept\) (made #[0-9]*\(, dropped\)\{0,1\})$/\1\2/p' \
          <<<"$mine" | tr '\n' ' ')
  if [ "$names" != "a, dropped b, dropped c, dropped d, dropped kept " ]; then
    echo "FAIL: rank $r: the split groups freed as: '$names' (want a b c d dropped, then kept)"
    status=1
  fi
  if [ "$(grep -c "freeing group" <<<"$mine")" -lt 6 ]; then
    echo "FAIL: rank $r freed fewer groups than it made (the mesh's and the five)"; status=1
  fi
done
[ "$status" -eq 0 ] && echo "PASS: every rank freed its groups at the exit, in the order made"
exit "$status"
