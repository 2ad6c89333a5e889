#!/usr/bin/env bash
# On one node the ranks talk over shared memory only: tetra keeps Open MPI's TCP
# transport off (OMPI_MCA_btl=self,vader unless the user set it), so no rank listens on
# a TCP port, let alone on 0.0.0.0. (mpirun's own control listeners are Open MPI's:
# docs/multinode.md says how to bind them.)
# Usage: bash no_listen.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
command -v ss >/dev/null || { echo "FAIL: ss (iproute2) is missing"; exit 1; }
# Each rank joins the job (a collective), writes its pid, then waits for the check.
code='local d = require("tetra.dist"); d.start()
local m = d.init({ parallel = { data_parallel_size = 2 } })
m.world:all_reduce(require("tetra").zeros(4))
local f = io.open(os.getenv("WORK") .. "/pid." .. m.rank, "w")
f:write(io.open("/proc/self/stat"):read("*l"):match("^(%d+)")); f:close()
while io.open(os.getenv("WORK") .. "/done") == nil do os.execute("sleep 0.1") end'
WORK="$work" timeout -k 10 60 mpirun --oversubscribe -np 2 -x WORK "$tetra" -e "$code" >"$work/run.log" 2>&1 &
job=$!
for _ in $(seq 100); do [ -f "$work/pid.0" ] && [ -f "$work/pid.1" ] && break; sleep 0.1; done
[ -f "$work/pid.0" ] && [ -f "$work/pid.1" ] || { echo "FAIL: the ranks did not start:"; cat "$work/run.log"; exit 1; }
sleep 0.5
listening="$(ss -ltnpH 2>/dev/null)"
touch "$work/done"
wait "$job" || { echo "FAIL: the job failed:"; cat "$work/run.log"; exit 1; }
status=0
for r in 0 1; do
  pid="$(cat "$work/pid.$r")"
  if grep -q "pid=$pid," <<<"$listening"; then
    echo "FAIL: rank $r (pid $pid) listens:"; grep "pid=$pid," <<<"$listening"; status=1
  fi
done
[ "$status" = 0 ] && echo PASS
exit "$status"
