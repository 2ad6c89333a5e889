#!/usr/bin/env bash
# The network as a variable: on a namespace cluster of 2 hosts x 2 slots (tools/cluster)
# whose links are shaped to 100 Mbit/s with 0.1% of the packets dropped at random
# (`tools/cluster shape all --rate 100mbit --loss 0.1%`: tc tbf and an iptables
# statistic rule on each host's eth0), dp2 x tp2 (TP inside each host, DP across, over
# the shaped eth0) still equals one process on loss and grad norm (tools/compare_loss).
# The shaping is really there: an 8 MB transfer between the hosts runs at 50-105% of
# 100 Mbit/s, the training's bytes went through each host's tbf, which held some back
# (overlimits), and the loss rules dropped packets (20-30 in a run: the transfer and the
# run send some 20,000 packets; none at all has a chance near 1e-8). `tools/cluster down` then leaves no
# namespace, link or file behind.
# Usage: bash cluster_shaped.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
source "$(dirname "$0")/cluster.bash"
command -v python3 >/dev/null || { echo "skipped: tools/cluster rate needs python3"; exit 77; }
cluster_up 2 2
failed=0
cluster shape all --rate 100mbit --loss 0.1% || { echo "FAIL: tools/cluster shape"; exit 1; }

# 1. A transfer between the hosts runs at the shaped rate (unshaped, veth moves several
# hundred MB/s here), not much slower either (the loss is 0.1%, not more).
read -r rate rtt < <(cluster rate node1 node2 8) || { echo "FAIL: tools/cluster rate"; exit 1; }
echo "node1 -> node2: $(awk -v r="$rate" 'BEGIN { printf "%.1f Mbit/s", 8 * r / 1e6 }'), round trip $(awk -v t="$rtt" 'BEGIN { printf "%.0f us", 1e6 * t }')"
awk -v r="$rate" 'BEGIN { exit !(r >= 0.5 * 12.5e6 && r <= 1.05 * 12.5e6) }' ||
  { echo "FAIL: $rate bytes/s is not within 50-105% of 100 Mbit/s (12.5e6 bytes/s)"; failed=1; }

# 2. Equal to one process across the shaped links.
cluster links >"$work/before.txt"
bash tools/compare_loss --tetra "$tetra" --np 4 \
  --via "$root/tools/cluster --name $cluster_name exec node1" --mpirun "${mpi_hosts[*]}" \
  --layout parallel.tensor_parallel_size=2 --layout parallel.data_parallel_size=2 \
  --out "$work/shaped" recipes/tiny.lua --set train.steps=20 --set train.lr=3e-3 \
  --set train.max_grad_norm=0.5 --set train.gradient_accumulation_steps=2 \
  >"$work/shaped.log" 2>&1
rc=$?
tail -n 1 "$work/shaped.log"
[ $rc -eq 0 ] || { echo "FAIL: dp2 x tp2 over shaped links differs from one process:"; cat "$work/shaped.log"; failed=1; }

# 3. What the shaping did during the run: HOST RATE LOSS SENT_BYTES OVERLIMITS LOSS_DROPS.
cluster links >"$work/after.txt"
cat "$work/after.txt"
awk 'NR == FNR { sent[$1] = $4; over[$1] = $5; drops[$1] = $6; next }
  {
    if ($2 != "100Mbit" || $3 != "0.1%") { print "FAIL: " $1 " is shaped " $2 " " $3 ", not 100Mbit 0.1%"; bad = 1 }
    moved = $4 - sent[$1]; held = $5 - over[$1]; dropped += $6
    printf "%s sent %.1f MB through tbf during the run, held back %d times\n", $1, moved / 1e6, held
    if (moved < 1e6) { print "FAIL: the training traffic of " $1 " did not go through its tbf"; bad = 1 }
    if (held < 1) { print "FAIL: the tbf of " $1 " never held a packet back: not shaping"; bad = 1 }
  }
  END {
    print "packets dropped by the loss rules since shaped (transfer and run): " dropped
    if (dropped < 1) { print "FAIL: no packet dropped: the loss is not applied"; bad = 1 }
    exit bad
  }' "$work/before.txt" "$work/after.txt" || failed=1

# 4. down takes the shaping with the hosts: nothing of the cluster is left.
cluster down
left="$(ip netns list | awk -v p="$cluster_name-" 'index($1, p) == 1')$(ip -o link show | awk -F': ' -v p="$cluster_name-" 'index($2, p) == 1 { print $2 }')"
[ -d "/run/tetra-cluster/$cluster_name" ] && left="$left /run/tetra-cluster/$cluster_name"
[ -z "$left" ] || { echo "FAIL: tools/cluster down left: $left"; failed=1; }
[ $failed -eq 0 ] && echo PASS
exit $failed
