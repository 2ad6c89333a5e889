# Sourced by the multi-host tests (tests/dist/cluster_*.sh) after prelude.bash: brings up
# a namespace cluster of its own (tools/cluster --name ttest, so a user's cluster "tt" is
# left alone; TETRA_CLUSTER_NAME=NAME picks another, for a second checkout testing at the
# same time) and tears it down on exit, also when the test fails. Needs root, iproute2
# and util-linux; without them the test is skipped (77), except under CI=true.
#   cluster_up N SLOTS   make hosts node1..nodeN
#   cluster ARGS...      tools/cluster on this cluster (exec, bytes, procs, link ...)
#   on_head CMD...       CMD on node1, where mpirun starts, as on a cluster's first node
#   mpi_hosts            (set by cluster_up) the mpirun arguments of the guide's launch
#   mpi_keepalive        the mpirun arguments that make it notice a lost host in seconds
cluster_name="${TETRA_CLUSTER_NAME:-ttest}"
cluster() { "$root/tools/cluster" --name "$cluster_name" "$@"; }
cluster_missing=""
[ "$(id -u)" = 0 ] || cluster_missing="root"
for tool in ip unshare nsenter; do
  command -v "$tool" >/dev/null || cluster_missing="$cluster_missing $tool"
done
if [ -n "$cluster_missing" ]; then
  [ "${CI:-}" = true ] && { echo "FAIL: a namespace cluster needs$cluster_missing (CI=true)"; exit 1; }
  echo "skipped: a namespace cluster needs$cluster_missing"; exit 77
fi
trap 'cluster down; rm -rf "$work"' EXIT
trap 'exit 143' TERM INT   # killed (ctest's timeout, Ctrl-C): tear down all the same
cluster_up() {
  cluster up "$1" --slots "$2" || { echo "FAIL: tools/cluster up $1 --slots $2"; exit 1; }
  mpi_hosts=(-hostfile "/run/tetra-cluster/$cluster_name/hostfile"
             -mca plm_rsh_agent "/run/tetra-cluster/$cluster_name/agent"
             --map-by "ppr:$2:node" --bind-to none
             -mca btl_tcp_if_include eth0 -mca oob_tcp_if_include eth0
             -x PATH -x OMP_NUM_THREADS -x ASAN_OPTIONS)
}
on_head() { cluster exec node1 "$@"; }
# oob keepalive: mpirun notices a host it lost (link down, packets dropped) within
# 5 + 2 x 3 s of silence, and ends the job (docs/multinode.md; tetra launch sets these).
mpi_keepalive=(-mca oob_tcp_keepalive_time 5 -mca oob_tcp_keepalive_intvl 2
               -mca oob_tcp_keepalive_probes 3)
# Sums of the byte counters over the hosts: "ETH0_TX LO_TX".
cluster_bytes() { cluster bytes | awk '{ eth += $3; lo += $4 } END { print eth, lo }'; }
