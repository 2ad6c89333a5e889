#!/usr/bin/env bash
# Pipeline schedules with point-to-point transfers in the order NCCL runs them on a GPU
# (TETRA_TEST_P2P_IN_ORDER=1, engine/dist/comm.c): a send completes only once its receiver
# took it, and nothing after it starts before, except the two halves of a sendrecv, which
# progress together as NCCL's grouped pair does. MPI alone lets sends run ahead, which hid
# that under 1F1B two neighbouring stages each sent before they received (stage s the next
# micro-batch's activations, stage s + 1 the last one's gradient) and would have waited on
# each other for good on GPUs; the pipeline now pairs a send with the receive after it
# (lua/tetra/parallel/pipeline.lua). A group ends only when all of it has, so in order a
# pair's send must also be received before anything after the pair starts; kept so, the
# interleaved schedule with pairs hung (stage 0 sent one gradient alone while stage 1's
# pair before the matching receive sent what stage 0 received only after that send: the
# emulated NCCL of tests/emu found it). It now moves each round's transfers as one group,
# as Megatron-LM does. Pipelines alone, and beside data, tensor and context parallelism
# (whose collectives run between the transfers), must finish in order (timeout 20 s
# against about 1 s; unpaired, 1F1B hangs, and with pairs the interleaved schedule, GPipe
# does not) and give the same losses and gradient norms, bit for bit, as without the
# switch. The interleaved cases include an odd number of stages and stages whose warm-up
# holds every forward (as many micro-batches as stages).
# Usage: bash pipeline_in_order.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
P=parallel
status=0
common=(--set train.steps=4 --set train.lr=3e-3 --set log.progress=false)

run() {   # run NAME NP IN_ORDER SETTINGS...: the run's (loss, grad_norm) lines in NAME.txt
  local name=$1 np=$2 in_order=$3; shift 3
  local sets=() kv
  for kv in "$@"; do sets+=(--set "$kv"); done
  TETRA_TEST_P2P_IN_ORDER=$in_order timeout -k 10 20 mpirun --oversubscribe -np "$np" \
    -x TETRA_TEST_P2P_IN_ORDER "$tetra" run recipes/tiny.lua "${common[@]}" "${sets[@]}" \
    --set log.metrics_file="$work/$name.jsonl" >"$work/$name.log" 2>&1
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "FAIL: $name: exit $rc (124 or 137: it hung)"; tail -n 5 "$work/$name.log"
    status=1; return 1
  fi
  grep -oE '"(loss|grad_norm)":[-0-9.e+]+' "$work/$name.jsonl" >"$work/$name.txt"
}

# The switch itself: in order a group (tt_comm_p2p) ends only once its send was received.
# Rank 1 waits 0.5 s, leaves a mark, and only then posts its receive; when rank 0's group
# of one send ends, the mark must be there (MPI alone ends it at once), and the data must
# arrive. (A file, not a clock: nothing here depends on how fast the ranks run.)
stop_if_failed
TETRA_TEST_P2P_IN_ORDER=1 MARK="$work/posted" timeout -k 5 20 mpirun --oversubscribe -np 2 \
  -x TETRA_TEST_P2P_IN_ORDER -x MARK "$tetra" -e '
  local tetra, dist, C = require("tetra"), require("tetra.dist"), require("ffi").C
  local mesh = dist.init({ parallel = { data_parallel_size = 2 }, dist = { timeout_s = 10 } })
  local mark = os.getenv("MARK")
  if mesh.rank == 0 then
    mesh.world:p2p({ { tetra.full({ 4096 }, 7.0), 1, 5 } }, {})
    local f = io.open(mark)
    print("group_send_received: the receive was " .. (f and "posted" or "not yet posted") ..
          " when the group of one send ended")
    if not f then print("FAIL: it ended before its send was received"); os.exit(1) end
    f:close()
  else
    os.execute("sleep 0.5")
    io.open(mark, "w"):close()
    local got = mesh.world:recv(tetra.full({ 4096 }, 0.0), 0, 5)
    if C.tt_tensor_get(got, 4095) ~= 7 then print("FAIL: the receive got other data"); os.exit(1) end
  end' >"$work/group_send.log" 2>&1 || { echo "FAIL: group_send_received:"; tail -n 5 "$work/group_send.log"; status=1; }
grep -h "group_send_received\|FAIL" "$work/group_send.log" || true

for lay in "pp2_1f1b 2 $P.pipeline_parallel_size=2 $P.pipeline_schedule=1f1b train.gradient_accumulation_steps=4 model.n_layers=3" \
           "pp4_1f1b 4 $P.pipeline_parallel_size=4 $P.pipeline_schedule=1f1b train.gradient_accumulation_steps=4 model.n_layers=4" \
           "pp2_v2_interleaved 2 $P.pipeline_parallel_size=2 $P.virtual_pipeline_size=2 $P.pipeline_schedule=interleaved_1f1b train.gradient_accumulation_steps=4 model.n_layers=4" \
           "pp3_v2_interleaved 3 $P.pipeline_parallel_size=3 $P.virtual_pipeline_size=2 $P.pipeline_schedule=interleaved_1f1b train.gradient_accumulation_steps=3 train.batch_size=6 model.n_layers=6" \
           "pp4_v2_interleaved 4 $P.pipeline_parallel_size=4 $P.virtual_pipeline_size=2 $P.pipeline_schedule=interleaved_1f1b train.gradient_accumulation_steps=8 model.n_layers=8" \
           "tp2_pp2_v2_interleaved 4 $P.tensor_parallel_size=2 $P.pipeline_parallel_size=2 $P.virtual_pipeline_size=2 $P.pipeline_schedule=interleaved_1f1b train.gradient_accumulation_steps=2 model.n_layers=4" \
           "pp2_gpipe 2 $P.pipeline_parallel_size=2 $P.pipeline_schedule=gpipe train.gradient_accumulation_steps=4" \
           "dp2_pp2_1f1b 4 $P.data_parallel_size=2 $P.pipeline_parallel_size=2 $P.pipeline_schedule=1f1b train.gradient_accumulation_steps=4 train.batch_size=16" \
           "tp2_pp2_1f1b 4 $P.tensor_parallel_size=2 $P.pipeline_parallel_size=2 $P.pipeline_schedule=1f1b train.gradient_accumulation_steps=4" \
           "cp2_pp2_1f1b 4 $P.context_parallel_size=2 $P.pipeline_parallel_size=2 $P.pipeline_schedule=1f1b train.gradient_accumulation_steps=4"; do
  stop_if_failed
  set -- $lay
  name=$1 np=$2; shift 2
  run "$name" "$np" 0 "$@" || continue
  run "${name}_in_order" "$np" 1 "$@" || continue
  if ! cmp -s "$work/$name.txt" "$work/${name}_in_order.txt"; then
    echo "FAIL: $name: in order, the losses differ:"; diff "$work/$name.txt" "$work/${name}_in_order.txt"
    status=1
  else
    echo "$name: in order, the same $(grep -c loss "$work/$name.txt") steps ($(head -1 "$work/$name.txt"))"
  fi
done
[ "$status" = 0 ] && echo PASS
exit "$status"
