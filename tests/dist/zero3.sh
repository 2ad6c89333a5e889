#!/usr/bin/env bash
# ZeRO-3 (parallel.zero_stage=3) against ZeRO-2 on 2 data-parallel ranks. The two differ in
# where the parameters live (ZeRO-3: each rank's share, the blocks gathered for their
# forward and again for their backward) and how the gradient buckets are cut (one per
# block), not in what is computed: every element's reduce-scatter is the same sum of two
# numbers, and the gathered weights are the ones ZeRO-2 keeps. So each step's loss and
# gradient norm must be ZeRO-2's bit for bit, over several steps (a stale gather, a block
# left released or gathered from the wrong share shows from the second step on), in
# fp32 with accumulation and selective recompute, bf16, fp16, fp8, and GPT-2. With
# optimizer offload it must be ZeRO-3 without it, bit for bit.
# Then: each step issues 2 gathers per block per micro-batch plus one per unit outside
# the blocks (the metrics' param_gathers), which move the bytes they should (bf16: the
# blocks' matrices in bf16, half of f32's); the start-up line names the parameters a rank
# holds; and what ZeRO-3 cannot go with is refused in one line.
# Usage: bash zero3.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
status=0

# run NAME ZERO RECIPE SETTINGS...: 6 steps on dp 2; the metrics in $work/NAME.jsonl.
run() {
  local name="$1" zero="$2" recipe="$3"; shift 3
  local sets=() kv
  for kv in "$@"; do sets+=(--set "$kv"); done
  mpirun --oversubscribe -np 2 "$tetra" run "$root/$recipe" --set train.steps=6 \
    --set train.lr=3e-3 --set train.max_grad_norm=0.5 --set parallel.data_parallel_size=2 \
    --set parallel.zero_stage="$zero" --set log.progress=false \
    --set log.metrics_file="$work/$name.jsonl" "${sets[@]}" >"$work/$name.log" 2>&1 ||
    { echo "FAIL: $name: the run failed:"; tail -n 20 "$work/$name.log"; status=1; return 1; }
}

# step, loss and grad_norm of every step record, as printed.
values() {
  grep '"loss"' "$1" | sed -E 's/.*"step":([0-9]+).*"loss":([^,]*),.*"grad_norm":([^,]*),.*/\1 \2 \3/'
}

# same TAG RECIPE SETTINGS...: ZeRO-2 and ZeRO-3 runs, compared.
same() {
  local tag="$1" recipe="$2"; shift 2
  run "${tag}_z2" 2 "$recipe" "$@" && run "${tag}_z3" 3 "$recipe" "$@" || return
  local a b
  a=$(values "$work/${tag}_z2.jsonl") b=$(values "$work/${tag}_z3.jsonl")
  if [ "$(echo "$a" | wc -l)" -ne 6 ]; then
    echo "FAIL: $tag: $(echo "$a" | wc -l) step records, want 6"; status=1
  elif [ "$a" != "$b" ]; then
    echo "FAIL: $tag: ZeRO-3 differs from ZeRO-2:"; diff <(echo "$a") <(echo "$b"); status=1
  else
    echo "$tag: 6 steps, ZeRO-3's loss and grad_norm are ZeRO-2's bit for bit ($(echo "$b" | tail -n 1))"
  fi
}

same fp32_accum2_selective recipes/tiny.lua train.gradient_accumulation_steps=2 train.recompute=selective
same bf16 recipes/tiny.lua train.precision=bf16
same fp16 recipes/tiny.lua train.precision=fp16
same fp8 recipes/tiny.lua train.precision=fp8
same gpt2_full_recompute recipes/gpt2.lua model.vocab_size=256 model.dim=64 model.n_layers=3 model.n_heads=4 \
  model.ffn_hidden=128 model.seq_len=32 train.warmup_steps=2 train.recompute=full

# Optimizer offload under ZeRO-3: each rank's shares of the moments live in host memory
# and its shards are updated there from host copies; on the CPU those copies change no
# bit, so ZeRO-3 with offload is ZeRO-3 without it (bf16 with accumulation; fp16 with an overflow
# injected at step 5, which must stay skipped on the host too).
offload_same() {
  local tag="$1" recipe="$2"; shift 2
  run "${tag}_z3" 3 "$recipe" "$@" &&
    run "${tag}_z3_off" 3 "$recipe" "$@" parallel.offload_optimizer=true || return
  local a b
  a=$(values "$work/${tag}_z3.jsonl") b=$(values "$work/${tag}_z3_off.jsonl")
  if [ "$(echo "$a" | wc -l)" -ne 6 ] || [ "$a" != "$b" ]; then
    echo "FAIL: $tag: ZeRO-3 with offload differs from ZeRO-3 without it:"
    diff <(echo "$a") <(echo "$b"); status=1
  else
    echo "$tag: 6 steps, ZeRO-3 with offload is ZeRO-3 bit for bit ($(echo "$b" | tail -n 1))"
  fi
}
offload_same offload_bf16_accum2 recipes/tiny.lua train.precision=bf16 \
  train.gradient_accumulation_steps=2
offload_same offload_fp16_overflow tests/dist/fp16_overflow.lua
if ! grep -q 'skipped steps {5}, loss scale 1024' "$work/offload_fp16_overflow_z3_off.log"; then
  echo "FAIL: offload_fp16_overflow: step 5 was not the one step skipped:"
  grep 'skipped' "$work/offload_fp16_overflow_z3_off.log"; status=1
fi
# Rank 0's shares of the tiny Llama are 53,424 floats: two moments of them on the host,
# and in bf16 the shares themselves (the f32 masters; AdamW:masters_on_host).
if ! grep -q "optimizer state 0.00 MB (offloaded: 0.43 MB in host memory; and 0.21 MB of f32 master weights (this rank's shares)" \
     "$work/offload_bf16_accum2_z3_off.log"; then
  echo "FAIL: the memory line does not show the shares' moments offloaded:"
  grep '^memory' "$work/offload_bf16_accum2_z3_off.log"; status=1
fi

# 2 blocks x 2 micro-batches x (forward + backward) + the embedding's and the head's
# units after the step = 10 gathers a step.
gathers=$(grep -o '"param_gathers":[0-9]*' "$work/fp32_accum2_selective_z3.jsonl" | cut -d: -f2 | sort -u)
if [ "$gathers" != 10 ]; then
  echo "FAIL: param_gathers per step: $(echo $gathers), want 10"; status=1
else
  echo "param_gathers: 10 a step (2 blocks x 2 micro-batches x 2 + 2)"
fi
# What the gathers moved a step (param_gather_bytes). The tiny Llama's block is 36,992
# floats (128 of them norm weights), the units outside the blocks 32,832. fp32 (2
# micro-batches): 8 block gathers and the 2 outside units, all f32. bf16 (1 micro-batch):
# 4 block gathers in bf16 (each rank's whole share cast), the norm weights' f32 sum beside
# each, and the outside units in f32.
want_fp32=$(( 8 * 36992 * 4 + 32832 * 4 )) want_bf16=$(( 4 * (36992 * 2 + 128 * 4) + 32832 * 4 ))
for run in "fp32_accum2_selective $want_fp32" "bf16 $want_bf16"; do
  set -- $run
  got=$(grep -o '"param_gather_bytes":[0-9]*' "$work/${1}_z3.jsonl" | cut -d: -f2 | sort -u)
  if [ "$got" != "$2" ]; then
    echo "FAIL: $1: param_gather_bytes a step $(echo $got), want $2"; status=1
  else
    echo "$1: the gathers move $2 bytes a step"
  fi
done
line=$(grep '^zero-3:' "$work/bf16_z3.log")
# The tiny Llama (tests/dist/memory.sh counts it): 106,848 floats whole; rank 0 keeps the
# embedding, final norm and head whole (32,832) and half of everything (53,424).
if ! echo "$line" | grep -q 'parameters held by rank 0: 0.3 MB (whole: 0.4 MB)'; then
  echo "FAIL: the zero-3 start-up line is '$line'"; status=1
else
  echo "start-up: $line"
fi

# refused NAME SETTING EXPECT: a config error naming what to change, before any step.
refused() {
  local out rc
  out=$(mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" --set train.steps=2 \
        --set parallel.data_parallel_size=2 --set parallel.zero_stage=3 --set "$2" 2>&1)
  rc=$?
  if [ "$rc" = 0 ] || ! echo "$out" | grep -q "config error: .*$3" || echo "$out" | grep -q '^step '; then
    echo "FAIL: $1 with ZeRO-3 is not refused as it should be (exit $rc):"; echo "$out" | head -n 5
    status=1
  else
    echo "$1: refused: $(echo "$out" | grep -m1 'config error')"
  fi
}
refused cuda_graphs train.cuda_graphs=true "set train.cuda_graphs=false or parallel.zero_stage <= 2"
refused sparse_embedding dist.sparse_embedding_grad=true "dist.sparse_embedding_grad=false"

[ "$status" = 0 ] && echo PASS
exit "$status"
