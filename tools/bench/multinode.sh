#!/usr/bin/env bash
# The network as a variable: data parallelism over 1, 2 and 4 hosts of a namespace cluster
# (tools/cluster up 4 --slots 1, one rank a host) at four link settings, each host's eth0
# shaped by `tools/cluster shape all`: unshaped (veth), 1 Gbit/s, 100 Mbit/s, and 100
# Mbit/s with 0.1% of the packets dropped at random. Weak scaling: every rank keeps the
# same batch (--per-rank sequences), so the global batch grows with the hosts.
# Prints a Markdown table, a row per link setting and host count: rank 0's median step
# time and exposed communication (the metrics' step_time_s and exposed_comm_s, steps > 2),
# the scaling efficiency against one host (its step time over this one's), and beside
# them `tetra plan`'s prediction of the same layout, given this cluster's links:
#   --inter-gbps  the shaped rate (unshaped: the rate measured between two hosts)
#   --inter-latency-us  half the measured round trip of one byte between two hosts
#   --sustained   calibrated once, so that one host's predicted step is its measured one
# The planner knows no packet loss: its 100 Mbit/s + loss rows are its 100 Mbit/s ones.
# On one machine every host shares its cores: 2 and 4 ranks on 2 cores compute slower than
# one, which no real cluster's hosts do, and which the planner (a core a rank) does not
# count; the efficiencies here mix that with the network's share.
#   tools/bench/multinode.sh [--tetra PATH] [--steps N] [--per-rank N] [--keep DIR]
#                            [--name NAME] [--mpirun ARGS]
# --mpirun ARGS adds mpirun arguments to every run, e.g. "-mca
# coll_libnbc_iallreduce_algorithm 1": Open MPI 4.1's nonblocking all-reduce of a buffer
# in place (Tetra's gradient buckets on CPU) reduces to one rank and broadcasts back
# (binomial) unless told otherwise, which moves the gradient over a link twice in a row;
# 1 makes it a ring, the algorithm the planner prices.
# Needs root, iproute2, util-linux, iptables, python3 and mpirun (as tools/cluster does).
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
tetra="$root/build/tetra" steps=10 per_rank=16 keep="" name=tbench mpirun_args=""
die() { echo "multinode.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --tetra|--steps|--per-rank|--keep|--name|--mpirun) [ $# -ge 2 ] || die "$1 needs a value" ;;&
    --tetra) tetra="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --per-rank) per_rank="$2"; shift 2 ;;
    --keep) keep="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --mpirun) mpirun_args="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ "$steps" =~ ^[0-9]+$ ]] && [ "$steps" -ge 4 ] || die "--steps must be a whole number of 4 or more"
[[ "$per_rank" =~ ^[1-9][0-9]*$ ]] || die "--per-rank must be a whole number above 0"
[ -x "$tetra" ] || die "no tetra executable at $tetra (build it: cmake --build build)"
tetra="$(cd "$(dirname "$tetra")" && pwd)/$(basename "$tetra")"
for tool in mpirun python3 iptables; do command -v "$tool" >/dev/null || die "needs $tool"; done
cores="$(getconf _NPROCESSORS_ONLN)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
work="$(mktemp -d "${TMPDIR:-/tmp}/tetra-multinode.XXXXXX")"
[ -n "$keep" ] && { mkdir -p "$keep" || die "cannot make $keep"; work="$(cd "$keep" && pwd)"; }
cluster() { "$root/tools/cluster" --name "$name" "$@"; }
trap 'cluster down; [ -n "$keep" ] || rm -rf "$work"' EXIT
trap 'exit 143' TERM INT

# A Llama of 1.05M parameters (4.2 MB of fp32 gradients a step to all-reduce), seq 64.
model=(--set model.dim=128 --set model.n_layers=4 --set model.n_heads=4 --set model.n_kv_heads=2
       --set model.ffn_hidden=384 --set model.vocab_size=1024 --set model.seq_len=64)
recipe="$root/recipes/tiny.lua"
settings=("unshaped|" "1 Gbit/s|--rate 1gbit" "100 Mbit/s|--rate 100mbit"
          "100 Mbit/s, 0.1% loss|--rate 100mbit --loss 0.1%")
hosts_list=(1 2 4)

echo "# tools/bench/multinode.sh  $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null)"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $cores cores${mpirun_args:+; mpirun $mpirun_args}"
cluster up 4 --slots 1 >/dev/null || die "tools/cluster up 4 failed"
dir="/run/tetra-cluster/$name"

# run HOSTS TAG: dp over HOSTS hosts, one rank each; the metrics go to $work/TAG.jsonl.
run() {
  local h="$1" tag="$2"
  rm -f "$work/$tag.jsonl"
  # shellcheck disable=SC2086  # mpirun_args are words
  cluster exec node1 mpirun -np "$h" -hostfile "$dir/hostfile" -mca plm_rsh_agent "$dir/agent" \
    --map-by ppr:1:node --bind-to none -mca btl_tcp_if_include eth0 -mca oob_tcp_if_include eth0 \
    $mpirun_args -x PATH -x OMP_NUM_THREADS "$tetra" run "$recipe" "${model[@]}" \
    --set parallel.data_parallel_size="$h" --set train.batch_size=$((h * per_rank)) \
    --set train.steps="$steps" --set train.warmup_steps=1 --set log.progress=false \
    --set log.metrics_file="$work/$tag.jsonl" >"$work/$tag.log" 2>&1 ||
    { tail -n 5 "$work/$tag.log" >&2; die "the run $tag failed (log: $work/$tag.log)"; }
}

# Medians over steps > 2 of a metrics file: "STEP_S EXPOSED_COMM_S".
medians() {
  python3 - "$1" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rows = [r for r in rows if r.get("step", 0) > 2]
print(statistics.median(r["step_time_s"] for r in rows),
      statistics.median(r.get("exposed_comm_s") or 0 for r in rows))
EOF
}

# The planner's row for dp over HOSTS hosts of one device: "STEP_S EXPOSED_COMM_S".
predict() {
  local h="$1"; shift
  "$tetra" plan "$recipe" "${model[@]}" --batch $((h * per_rank)) --cluster cpu --nodes "$h" \
    --devices-per-node 1 --dp "$h" --tp 1 --pp 1 --cp 1 --all --json "$@" >"$work/plan.json" ||
    die "tetra plan failed"
  python3 - "$work/plan.json" "$per_rank" <<'EOF'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))
        if r["zero_stage"] == 0 and not r["sequence_parallel"] and r["recompute"] == "none"
        and r["micro_batch"] == int(sys.argv[2])]
print(rows[0]["step_s"], rows[0]["exposed_comm_s"])
EOF
}

# One host: no link crossed, the same at every setting; it calibrates the planner.
run 1 dp1
read -r base_step base_comm < <(medians "$work/dp1.jsonl")
read -r pred1 _ < <(predict 1)
sustained=$(awk -v p="$pred1" -v m="$base_step" 'BEGIN { printf "%.4f", p / m }')
echo "# 1 host: step $(awk -v s="$base_step" 'BEGIN { printf "%.1f", 1e3 * s }') ms; planner's cpu cluster calibrated to it: --sustained $sustained"

table=()
for setting in "${settings[@]}"; do
  label="${setting%%|*}" shape="${setting#*|}"
  if [ -n "$shape" ]; then
    # shellcheck disable=SC2086  # the shape's options are words
    cluster shape all $shape
  else
    cluster shape all off
  fi
  read -r rate rtt < <(cluster rate node1 node2 "$([ -n "$shape" ] && echo 8 || echo 64)") ||
    die "tools/cluster rate failed"
  lat_us=$(awk -v t="$rtt" 'BEGIN { printf "%.1f", 1e6 * t / 2 }')
  case "$shape" in
    *1gbit*) gbps=1 ;;
    *100mbit*) gbps=0.1 ;;
    *) gbps=$(awk -v r="$rate" 'BEGIN { printf "%.3f", 8 * r / 1e9 }') ;;
  esac
  echo "# $label: node1 -> node2 measured $(awk -v r="$rate" 'BEGIN { printf "%.1f", 8 * r / 1e6 }') Mbit/s, round trip $(awk -v t="$rtt" 'BEGIN { printf "%.0f", 1e6 * t }') us; planner: --inter-gbps $gbps --inter-latency-us $lat_us"
  for h in "${hosts_list[@]}"; do
    if [ "$h" = 1 ]; then
      step=$base_step comm=$base_comm
    else
      tag="$(echo "$label" | tr -c 'a-zA-Z0-9\n' '_')_dp$h"
      run "$h" "$tag"
      read -r step comm < <(medians "$work/$tag.jsonl")
    fi
    read -r pstep pcomm < <(predict "$h" --inter-gbps "$gbps" --inter-latency-us "$lat_us" \
                                    --sustained "$sustained")
    table+=("$(awk -v l="$label" -v h="$h" -v s="$step" -v c="$comm" -v b="$base_step" \
                   -v ps="$pstep" -v pc="$pcomm" -v pb="$pred1" -v sus="$sustained" 'BEGIN {
      pb = pb / sus   # one host predicted at the calibrated fraction: the measured step
      printf "| %s | %d | %.1f | %.1f | %.0f%% | %.1f | %.1f | %.0f%% |", l, h, 1e3 * s, 1e3 * c,
             100 * b / s, 1e3 * ps, 1e3 * pc, 100 * pb / ps }')")
  done
  if [[ "$shape" == *loss* ]]; then
    echo "# $label: packets dropped by the loss rules: $(cluster links | awk '{ d += $6 } END { print d }')"
  fi
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| link | hosts (dp) | step ms | exposed comm ms | efficiency | predicted step ms | predicted exposed comm ms | predicted efficiency |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${table[@]}"
