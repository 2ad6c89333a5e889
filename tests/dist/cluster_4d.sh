#!/usr/bin/env bash
# The 16-rank 4D row (tp2 x cp2 x dp2 x pp2, ZeRO-1, sequence parallelism) launched as on
# a cluster, on 4 namespace hosts x 4 slots (tools/cluster, --map-by ppr:4:node): equal
# to one process on loss and grad norm (tools/compare_loss). The default order puts each
# tp x cp block of 4 ranks on one host; dp and pp go across hosts over eth0.
# Usage: bash cluster_4d.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
source "$(dirname "$0")/cluster.bash"
cluster_up 4 4
args=()
for s in parallel.tensor_parallel_size=2 parallel.context_parallel_size=2 \
         parallel.data_parallel_size=2 parallel.pipeline_parallel_size=2 \
         parallel.zero_stage=1 parallel.sequence_parallel=true; do
  args+=(--layout "$s")
done
bash tools/compare_loss --tetra "$tetra" --np 16 \
  --via "$root/tools/cluster --name $cluster_name exec node1" --mpirun "${mpi_hosts[*]}" \
  "${args[@]}" --out "$work/4d" recipes/tiny.lua --set train.steps=20 --set train.lr=3e-3 \
  --set train.max_grad_norm=0.5 --set train.gradient_accumulation_steps=2 \
  >"$work/4d.log" 2>&1
rc=$?
tail -n 1 "$work/4d.log"
[ $rc -eq 0 ] || { echo "FAIL: the 16-rank 4D layout on 4 hosts differs from one process:"; cat "$work/4d.log"; exit 1; }
echo PASS
