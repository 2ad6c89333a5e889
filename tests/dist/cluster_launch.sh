#!/usr/bin/env bash
# The guide's multi-node launch for real, on a namespace cluster of 4 hosts x 2 slots
# (tools/cluster): mpirun -hostfile --map-by ppr:2:node -mca btl_tcp_if_include eth0
# runs dp2 x tp2 x pp2 and equals one process on loss and grad norm (tools/compare_loss).
# Ranks land as docs/multinode.md says: each TP group inside one host, DP and PP groups
# across hosts (from each rank's own view of its groups and hostname). TP traffic stays
# off the network: the hosts' eth0 counters move several times more bytes when the
# order maps TP across hosts, and the hosts' loopback stays quiet (the ranks of one host
# talk over shared memory, not TCP).
# Usage: bash cluster_launch.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
source "$(dirname "$0")/cluster.bash"
cluster_up 4 2
layout=(parallel.tensor_parallel_size=2 parallel.data_parallel_size=2
        parallel.pipeline_parallel_size=2)
common=(train.steps=20 train.lr=3e-3 train.max_grad_norm=0.5 train.gradient_accumulation_steps=2
        train.batch_size=16 model.n_layers=8 model.n_heads=8 model.n_kv_heads=8 model.ffn_hidden=128)
failed=0

# 1. Where the groups land.
on_head mpirun -np 8 "${mpi_hosts[@]}" "$tetra" run tests/dist/cluster_groups.lua \
  >"$work/groups.log" 2>&1 || { echo "FAIL: the groups run failed:"; cat "$work/groups.log"; exit 1; }
grep '^groups:' "$work/groups.log" | sort -k3n
awk '/^groups:/ { host[$3] = $5; tp[$3] = $7; dp[$3] = $9; pp[$3] = $11; n++ }
  function hosts_of(list,    r, k, i, out, seen) {
    k = split(list, r, ","); out = ""
    for (i = 1; i <= k; i++) if (!(host[r[i]] in seen)) { seen[host[r[i]]]; out = out " " host[r[i]] }
    return out
  }
  function count(s,    a) { return split(s, a, " ") }
  END {
    bad = (n != 8) ? 1 : 0
    if (bad) print "FAIL: " n " group lines, want 8"
    for (r in host) {
      if (count(hosts_of(tp[r])) != 1) { print "FAIL: rank " r ": tp group " tp[r] " spans" hosts_of(tp[r]); bad = 1 }
      if (count(hosts_of(dp[r])) != 2) { print "FAIL: rank " r ": dp group " dp[r] " on" hosts_of(dp[r]); bad = 1 }
      if (count(hosts_of(pp[r])) != 2) { print "FAIL: rank " r ": pp group " pp[r] " on" hosts_of(pp[r]); bad = 1 }
    }
    exit bad
  }' "$work/groups.log" || failed=1

# 2. Equal to one process, and the bytes each host's eth0 and lo carried.
via="$root/tools/cluster --name $cluster_name exec node1"
compare() {   # compare NAME [extra --layout settings]
  local name="$1"; shift
  local args=() sets=() s
  for s in "${layout[@]}" "$@"; do args+=(--layout "$s"); done
  for s in "${common[@]}"; do sets+=(--set "$s"); done
  local before after
  before=$(cluster_bytes)
  bash tools/compare_loss --tetra "$tetra" --np 8 --via "$via" --mpirun "${mpi_hosts[*]}" \
    "${args[@]}" --out "$work/$name" recipes/tiny.lua "${sets[@]}" >"$work/$name.log" 2>&1
  local rc=$?
  after=$(cluster_bytes)
  tail -n 1 "$work/$name.log"
  [ $rc -eq 0 ] || { echo "FAIL: $name differs from one process:"; cat "$work/$name.log"; failed=1; }
  read -r eth0 lo < <(echo "$before $after" | awk '{ print $3 - $1, $4 - $2 }')
}
compare tp_in_host
tp_in_eth0=$eth0 tp_in_lo=$lo
compare tp_across parallel.order=dp-tp-cp-pp
tp_across_eth0=$eth0
echo "eth0 bytes sent, all hosts: $tp_in_eth0 with TP inside each host, $tp_across_eth0 with TP across hosts"
echo "lo bytes sent, all hosts (TCP within a host): $tp_in_lo"
# (measured: 2.75x since q/k/v and the MLP share one gather and one gradient all-reduce
# each, 4 TP collectives a layer where there were 7; over 3x before)
if [ "$tp_across_eth0" -lt $((2 * tp_in_eth0)) ]; then
  echo "FAIL: TP across hosts moved under 2x the bytes over eth0: TP traffic crosses eth0 either way"
  failed=1
fi
if [ "$tp_in_lo" -gt 2000000 ]; then
  echo "FAIL: $tp_in_lo bytes over the hosts' loopback: ranks of one host talk TCP, not shared memory"
  failed=1
fi
[ $failed -eq 0 ] && echo PASS
exit $failed
