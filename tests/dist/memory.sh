#!/usr/bin/env bash
# What each rank holds equals its analytic share of the model. The tiny Llama (vocabulary
# V 256, dim D 64, 2 layers, 4 query heads and 2 key/value heads of 16, MLP hidden 128,
# untied head) has, in floats: embedding and head V*D = 16384 each; per layer q and o
# 4096 each, k and v 2048 each, the MLP's three matrices 24576, two norms 128; the final
# norm 64. Every rank's parameter, gradient (as many) and AdamW state (twice as many, or
# its ZeRO-1 share; under ZeRO-2 the gradients are that share too) bytes, as the metrics
# report them, must be those counts x 4 for its layout. Then sequence parallelism must
# lower a step's peak memory (activations held on 1/tp of the sequence between the
# tensor-parallel regions) against plain tp 2, activation recompute must lower it under
# tp 2 + sp and under pp 2, and ZeRO-2 the allocator's peak against ZeRO-1 on dp 2 (the
# whole gradients and the bucket buffers released), and checkpoints under ZeRO-1 and ZeRO-3
# must not put the whole optimizer state or model on a rank at once; under ZeRO and
# without it, the data-parallel ranks share a checkpoint's writing and reading.
# Its cases, for TETRA_TEST_CASES (tests/dist/prelude.bash's wanted): layouts, init_from,
# gpt2_folder, peaks, ckpt_zero1, ckpt_plain_dp and ckpt_zero3.
# Usage: bash memory.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"

E=16384 LQ=4096 LK=2048 LMLP=24576 NORMS=128 FINAL=64
LAYER=$((2 * LQ + 2 * LK + LMLP + NORMS))   # 36992
status=0

# check NAME NP "settings" EXPECT...: EXPECT is "tp:pp:params:optimizer[:grads]" (floats;
# grads as many as params unless given) per (tp, pp) coordinate; every rank at those
# coordinates must report exactly that.
check() {
  local name="$1" np="$2" settings="$3"; shift 3
  local sets=() kv
  for kv in $settings; do sets+=(--set "$kv"); done
  local cmd=("$tetra" run "$root/tests/dist/memory.lua" --set train.steps=1
             --set train.warmup_steps=1 "${sets[@]}")
  [ "$np" -gt 1 ] && cmd=(mpirun --oversubscribe -np "$np" "${cmd[@]}")
  if ! timeout -k 10 120 "${cmd[@]}" >"$work/$name.log" 2>&1; then
    echo "FAIL: $name: the run failed:"; tail -n 20 "$work/$name.log"; status=1; return
  fi
  local n
  n=$(grep -c '^memory rank' "$work/$name.log")
  [ "$n" -eq "$np" ] || { echo "FAIL: $name: $n of $np ranks reported"; status=1; return; }
  local e tp pp params optim grads before=$status
  for e in "$@"; do
    IFS=: read -r tp pp params optim grads <<<"$e"
    grads=${grads:-$params}
    while read -r _ _ rank _ rtp _ rpp _ p _ g _ o; do
      [ "$rtp" = "$tp" ] && [ "$rpp" = "$pp" ] || continue
      if [ "$p" -ne $((4 * params)) ] || [ "$g" -ne $((4 * grads)) ] || [ "$o" -ne $((4 * optim)) ]; then
        echo "FAIL: $name: rank $rank (tp $tp, pp $pp) holds params $p, grads $g, optimizer $o" \
             "bytes; want $((4 * params)), $((4 * grads)), $((4 * optim))"
        status=1
      fi
    done < <(grep '^memory rank' "$work/$name.log")
  done
  [ "$status" = "$before" ] && echo "$name: every rank holds its share"
}

ONE=$((2 * E + 2 * LAYER + FINAL))
TP2=$((E / 2 + 2 * ((LAYER - NORMS) / 2 + NORMS) + FINAL + E / 2))
S0=$((E + LAYER)) S1=$((LAYER + FINAL + E))
T0=$((E / 2 + (LAYER - NORMS) / 2 + NORMS)) T1=$(((LAYER - NORMS) / 2 + NORMS + FINAL + E / 2))
TP4=$((E / 4 + 2 * (2 * LQ / 4 + 2 * (LK / 2) + LMLP / 4 + NORMS) + FINAL + E / 4))
# The set-up: the recipe builds the whole model, but its parameters are drawn lazily and
# the optimizer's state is lazy zeros, so a rank's allocator peak through the set-up must
# be what it keeps, its parameters and optimizer state (within 1%), not the whole model
# besides (tp 4: 541,952 bytes, where it keeps 347,904; tp 2 x pp 2: 534,016 and
# 321,024): every rank of tp 4 and of tp 2 x pp 2.
# setup_peaks NAME: every rank's "setup rank R peak P" against its "memory rank" line.
setup_peaks() {
  local name="$1" r peak params optim before=$status
  while read -r _ _ r _ peak; do
    read -r params optim < <(sed -n \
      "s/^memory rank $r tp [0-9]* pp [0-9]* params \([0-9]*\) grads [0-9]* optimizer \([0-9]*\)\$/\1 \2/p" \
      "$work/$name.log")
    if [ -z "$params" ] || [ "$peak" -gt $(((params + optim) * 101 / 100)) ]; then
      echo "FAIL: $name: rank $r's set-up peaked at $peak bytes; it keeps $params of" \
           "parameters and ${optim:-?} of optimizer state"
      status=1
    fi
  done < <(grep '^setup rank' "$work/$name.log")
  [ "$status" = "$before" ] && echo "$name: every rank's set-up held its own part alone"
}
if wanted layouts; then
  check one 1 "" "0:0:$ONE:$((2 * ONE))"
  # tp 2: matrices halved, norms replicated.
  check tp2 2 "parallel.tensor_parallel_size=2" "0:0:$TP2:$((2 * TP2))" "1:0:$TP2:$((2 * TP2))"
  # pp 2: the first stage the embedding and layer 0, the last layer 1, the norm and the head.
  check pp2 2 "parallel.pipeline_parallel_size=2" "0:0:$S0:$((2 * S0))" "0:1:$S1:$((2 * S1))"
  # tp 2 x pp 2.
  check tp2_pp2 4 "parallel.tensor_parallel_size=2 parallel.pipeline_parallel_size=2" \
    "0:0:$T0:$((2 * T0))" "1:0:$T0:$((2 * T0))" "0:1:$T1:$((2 * T1))" "1:1:$T1:$((2 * T1))"
  # dp 2 with ZeRO-1: whole parameters, half of the AdamW state (one bucket, split in two).
  check dp2_zero1 2 "parallel.data_parallel_size=2 parallel.zero_stage=1" "0:0:$ONE:$ONE"
  # ZeRO-2: the same, and half of the gradients.
  check dp2_zero2 2 "parallel.data_parallel_size=2 parallel.zero_stage=2" "0:0:$ONE:$ONE:$((ONE / 2))"
  # ZeRO-3: half of every parameter (the master weights) besides the whole embedding, final
  # norm and head (outside the blocks, kept gathered); the blocks' parameters only while
  # they run.
  check dp2_zero3 2 "parallel.data_parallel_size=2 parallel.zero_stage=3" \
    "0:0:$((2 * E + FINAL + ONE / 2)):$ONE:$((ONE / 2))"
  # tp 4 with 2 key/value heads: q, o and the MLP in quarters, one whole k and v head each.
  check tp4_kv2 4 "parallel.tensor_parallel_size=4" \
    "0:0:$TP4:$((2 * TP4))" "1:0:$TP4:$((2 * TP4))" "2:0:$TP4:$((2 * TP4))" "3:0:$TP4:$((2 * TP4))"
  setup_peaks tp4_kv2
  setup_peaks tp2_pp2
fi
# model.init_from a checkpoint (one process's) under tp 4: read once the model is split,
# each rank copies out of it exactly the parameter bytes it keeps and sums less than
# three quarters of model.safetensors (its slices' blocks; the moments' file not at all),
# where every rank read every parameter whole into the whole model, and its set-up
# still peaks at what it keeps.
if wanted init_from; then
  if "$tetra" run "$root/tests/dist/memory.lua" --set train.steps=1 --set train.warmup_steps=1 \
       --set checkpoint.dir="$work/ck_one" >"$work/ck_one.log" 2>&1; then
    check tp4_init 4 "parallel.tensor_parallel_size=4 model.init_from=$work/ck_one/step_000001" \
      "0:0:$TP4:$((2 * TP4))" "1:0:$TP4:$((2 * TP4))" "2:0:$TP4:$((2 * TP4))" "3:0:$TP4:$((2 * TP4))"
    setup_peaks tp4_init
    model_bytes=$(stat -c %s "$work/ck_one/step_000001/model.safetensors")
    n=0
    while read -r _ _ r _ copied _ summed; do
      n=$((n + 1))
      echo "tp4 init_from: rank $r copied $copied and summed $summed bytes (parameters" \
           "$((4 * TP4)), model.safetensors $model_bytes)"
      if [ "$copied" -ne $((4 * TP4)) ] || [ "$summed" -ge $((model_bytes * 3 / 4)) ]; then
        echo "FAIL: tp4 init_from: rank $r read more of the checkpoint than its part"; status=1
      fi
    done < <(grep '^init rank' "$work/tp4_init.log")
    [ "$n" -eq 4 ] || { echo "FAIL: tp4 init_from: $n of 4 ranks reported their reads"; status=1; }
    # The same from a Hugging Face folder of it (tetra convert --to hf): a Llama's tensors are
    # Tetra's under other names, so each rank reads its part of them alone too.
    if "$tetra" convert --to hf "$work/ck_one/step_000001" "$work/hf_one" >"$work/hf_one.log" 2>&1; then
      check tp4_hf 4 "parallel.tensor_parallel_size=4 model.init_from=hf:$work/hf_one" \
        "0:0:$TP4:$((2 * TP4))" "1:0:$TP4:$((2 * TP4))" "2:0:$TP4:$((2 * TP4))" "3:0:$TP4:$((2 * TP4))"
      setup_peaks tp4_hf
      n=$(grep -c "^init rank [0-3] copied $((4 * TP4)) " "$work/tp4_hf.log")
      echo "tp4 init_from=hf: $n of 4 ranks copied exactly their $((4 * TP4)) parameter bytes"
      [ "$n" -eq 4 ] || { echo "FAIL: tp4 init_from=hf: a rank read more than its part"; status=1; }
    else
      echo "FAIL: tetra convert --to hf failed:"; tail -n 20 "$work/hf_one.log"; status=1
    fi
  else
    echo "FAIL: the one-process checkpoint for init_from failed:"; tail -n 20 "$work/ck_one.log"
    status=1
  fi
fi
# A GPT-2 folder likewise, though its tensors are not Tetra's as they are: the Conv1D
# weights are transposed, and c_attn holds q, k and v side by side (their biases one after
# the other). Under tp 2 each rank must copy out exactly the parameter bytes it keeps
# (every rank read the whole folder into the whole model before), and its first loss must
# be the one process's from the checkpoint the folder was made of, bit for bit (printed
# to 9 digits).
if wanted gpt2_folder; then
  G2="model.dim=64 model.n_heads=4 model.n_layers=2 model.vocab_size=256 model.ffn_hidden=128 model.seq_len=32"
  g2=()
  for kv in $G2; do g2+=(--set "$kv"); done
  if MEMORY_RECIPE=gpt2 "$tetra" run "$root/tests/dist/memory.lua" "${g2[@]}" --set train.steps=1 \
       --set train.warmup_steps=1 --set checkpoint.dir="$work/ck_gpt2" >"$work/ck_gpt2.log" 2>&1 &&
     "$tetra" convert --to hf "$work/ck_gpt2/step_000001" "$work/hf_gpt2" >>"$work/ck_gpt2.log" 2>&1; then
    MEMORY_RECIPE=gpt2 check gpt2_one 1 "$G2 model.init_from=$work/ck_gpt2/step_000001"
    MEMORY_RECIPE=gpt2 check gpt2_tp2_hf 2 "$G2 parallel.tensor_parallel_size=2 model.init_from=hf:$work/hf_gpt2"
    want=$(sed -n 's/^loss rank 0 //p' "$work/gpt2_one.log")
    for r in 0 1; do
      read -r params < <(sed -n "s/^memory rank $r tp [0-9]* pp 0 params \([0-9]*\) .*/\1/p" \
                             "$work/gpt2_tp2_hf.log")
      copied=$(sed -n "s/^init rank $r copied \([0-9]*\) .*/\1/p" "$work/gpt2_tp2_hf.log")
      loss=$(sed -n "s/^loss rank $r //p" "$work/gpt2_tp2_hf.log")
      echo "gpt2 tp2 init_from=hf: rank $r copied $copied bytes, keeps $params; first loss" \
           "$loss (one process from the checkpoint: $want)"
      if [ -z "$copied" ] || [ "$copied" != "$params" ]; then
        echo "FAIL: gpt2 tp2 init_from=hf: rank $r did not read exactly its part"; status=1
      fi
      if [ -z "$want" ] || [ "$loss" != "$want" ]; then
        echo "FAIL: gpt2 tp2 init_from=hf: rank $r's first loss is not the one process's"; status=1
      fi
    done
    # dp 2 without ZeRO: both ranks hold the whole model, and each copies out of the folder
    # only the parameters dealt to it (the other's come by broadcast): together exactly the
    # model's bytes, each less than them.
    MEMORY_RECIPE=gpt2 check gpt2_dp2_hf 2 "$G2 parallel.data_parallel_size=2 model.init_from=hf:$work/hf_gpt2"
    read -r params < <(sed -n "s/^memory rank 0 tp 0 pp 0 params \([0-9]*\) .*/\1/p" \
                           "$work/gpt2_dp2_hf.log")
    both=0
    for r in 0 1; do
      copied=$(sed -n "s/^init rank $r copied \([0-9]*\) .*/\1/p" "$work/gpt2_dp2_hf.log")
      echo "gpt2 dp2 init_from=hf: rank $r copied ${copied:-?} of the model's ${params:-?} bytes"
      if [ -z "$copied" ] || [ -z "$params" ] || [ "$copied" -ge "$params" ]; then
        echo "FAIL: gpt2 dp2 init_from=hf: rank $r read the whole model"; status=1
      fi
      both=$((both + ${copied:-0}))
    done
    if [ "$both" != "${params:-}" ]; then
      echo "FAIL: gpt2 dp2 init_from=hf: the ranks copied $both bytes between them, not the" \
           "model's ${params:-?}"; status=1
    fi
  else
    echo "FAIL: the GPT-2 checkpoint and its folder failed:"; tail -n 20 "$work/ck_gpt2.log"
    status=1
  fi
fi

# Sequence parallelism: a step's peak on rank 0, longer sequences so activations dominate
# (measured in fp32: 16.4 MB against plain tp 2's 17.5 MB, whose column-parallel inputs
# are views; 19.6 MB against 23.3 MB when copy_to_group copied them and each projection
# gathered its own input).
# peak NAME "settings": the step peak rank 0 reports in the second step.
if wanted peaks; then
  peak() {
    local sets=() kv
    for kv in $2; do sets+=(--set "$kv"); done
    mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" --set train.steps=2 \
      --set train.warmup_steps=1 --set model.seq_len=256 --set log.progress=false \
      "${sets[@]}" --set log.metrics_file="$work/$1.jsonl" >"$work/$1.log" 2>&1 ||
      { echo "FAIL: $1 run failed:" >&2; tail -n 20 "$work/$1.log" >&2; return 1; }
    tail -n 1 "$work/$1.jsonl" | sed -E 's/.*"step_peak_bytes":([0-9]+).*/\1/'
  }
  tp2="parallel.tensor_parallel_size=2"
  plain=$(peak tp2 "$tp2") && sp=$(peak tp2_sp "$tp2 parallel.sequence_parallel=true") || exit 1
  echo "step peak on rank 0: tp 2 $plain bytes, with sequence parallelism $sp bytes"
  if [ "$sp" -ge $((plain * 95 / 100)) ]; then
    echo "FAIL: sequence parallelism does not lower the peak by 5% or more"; status=1
  fi
  # Activation recompute (train.recompute=full) keeps only each block's input: under tp 2
  # with sequence parallelism and under pp 2 (1F1B, 4 micro-batches) it must lower rank
  # 0's step peak by a quarter or more (measured: 43% and 31%; the first stage also holds
  # the embedding's gradient and the micro-batches in flight).
  pp2="parallel.pipeline_parallel_size=2 train.gradient_accumulation_steps=4"
  for layout in "tp2_sp|$tp2 parallel.sequence_parallel=true" "pp2|$pp2"; do
    name="${layout%%|*}" sets="${layout#*|}"
    before=$(peak "${name}_none" "$sets") && after=$(peak "${name}_full" "$sets train.recompute=full") ||
      exit 1
    echo "step peak on rank 0, $name: $before bytes, with train.recompute=full $after bytes"
    if [ "$after" -ge $((before * 3 / 4)) ]; then
      echo "FAIL: $name: train.recompute=full does not lower the peak by a quarter or more"; status=1
    fi
  done


  # ZeRO-2 against ZeRO-1 on dp 2: the allocator's peak during a step on rank 0 (absolute:
  # ZeRO-1's bucket buffers live across steps, so they are not in its step_peak_bytes). The
  # gradients of the tiny model are 4 x ONE bytes; ZeRO-2 never holds all of them at once
  # with its buckets (ZeRO-1 holds both, each whole), so its peak must be lower by at least
  # half of them.
  zero_peak() {
    mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" --set train.steps=2 \
      --set train.warmup_steps=1 --set parallel.data_parallel_size=2 \
      --set parallel.zero_stage="$1" --set log.progress=false "${@:2}" \
      --set log.metrics_file="$work/zero_$1.jsonl" >"$work/zero_$1.log" 2>&1 ||
      { echo "FAIL: zero_stage=$1 run failed:" >&2; tail -n 20 "$work/zero_$1.log" >&2; return 1; }
    tail -n 1 "$work/zero_$1.jsonl" | sed -E 's/.*"peak_bytes":([0-9]+).*/\1/'
  }
  z1=$(zero_peak 1) && z2=$(zero_peak 2) || exit 1
  echo "peak on rank 0, dp 2: ZeRO-1 $z1 bytes, ZeRO-2 $z2 bytes (gradients $((4 * ONE)) bytes)"
  if [ "$z2" -gt $((z1 - 2 * ONE)) ]; then
    echo "FAIL: ZeRO-2 does not lower the peak by half the gradient bytes or more"; status=1
  fi
  # ZeRO-3 against ZeRO-2 with 8 layers: at most two blocks are gathered at once (the one
  # running and the next, prefetched) besides the half of every block a rank keeps, so of
  # the 8 layers' parameters (8 x LAYER floats) 8 / 2 + 2 are there at the peak: ZeRO-3's
  # peak must be lower by at least one layer's bytes.
  z2=$(zero_peak 2 --set model.n_layers=8) && z3=$(zero_peak 3 --set model.n_layers=8) || exit 1
  echo "peak on rank 0, dp 2, 8 layers: ZeRO-2 $z2 bytes, ZeRO-3 $z3 bytes (a layer $((4 * LAYER)) bytes)"
  if [ "$z3" -gt $((z2 - 4 * LAYER)) ]; then
    echo "FAIL: ZeRO-3 does not lower the peak by a layer's parameter bytes or more"; status=1
  fi
fi
# A checkpoint under ZeRO-1 on dp 2: each parameter's whole moments are put together on
# the rank that writes it alone, one parameter at a time (the others send it their
# pieces), and it keeps them on the host (the data-parallel ranks share the writing:
# about half each). Beyond those host copies (on the CPU the same allocator), each rank's
# peak during the save must stay under half of the largest parameter's tensor (the
# embedding, 4 x E bytes): an all-reduce of each parameter's moments made it whole on
# every rank (one embedding beyond, measured), and before that every rank held the whole
# moments at once (8 x ONE bytes; on a GPU, 8 bytes a parameter more on every device at
# the first save); and each must keep some.
# save_peaks NAME OUT BOUND WHAT WHOLE: every rank's "save rank R peak N kept K" line in
# OUT; each rank must keep some of the WHOLE bytes to write and at most three quarters.
save_peaks() {
  local name="$1" out="$2" bound="$3" what="$4" whole="$5" r line peak kept gathers summed
  for r in 0 1; do
    line=$(grep "^save rank $r peak" <<<"$out")
    read -r _ _ _ _ peak _ kept _ gathers _ summed <<<"$line"
    echo "$name save on dp 2: rank $r's peak rose $peak bytes; it writes $kept of the" \
         "$whole bytes of state (host copies under ZeRO); $gathers units gathered, $summed" \
         "bytes read back to sum"
    if [ -z "$peak" ] || [ "$kept" -le 0 ] || [ "$kept" -gt $((whole * 3 / 4)) ]; then
      echo "FAIL: $name: rank $r did not keep a share of what the checkpoint writes"
      status=1
    elif [ $((peak - kept)) -ge "$bound" ]; then
      echo "FAIL: $name: rank $r held $what or more besides what it writes"; status=1
    elif [ "$gathers" != 0 ]; then
      echo "FAIL: $name: rank $r gathered $gathers units whole to save"; status=1
    elif [ "$summed" != 0 ]; then   # the sums are taken as the files are written
      echo "FAIL: $name: rank $r read $summed bytes of its files back to sum them"; status=1
    fi
  done
}
# A load under ZeRO reads from the checkpoint's files only this rank's shards of the
# parameters and the moments, and checks only the blocks of the files that hold them
# (checksums.json's block sums), then gathers the parameters: on dp 2 each rank must copy
# out about half of the safetensors bytes and sum less than two thirds of them (measured:
# half, and 0.56 with the blocks around the shards), where every rank read them all, and
# summed them all, before.
# load_reads NAME OUT: every rank's "load rank R peak P copied C summed S of T" line.
load_reads() {
  local name="$1" out="$2" r copied summed total
  for r in 0 1; do
    read -r copied summed total < <(sed -n \
      "s/^load rank $r peak [0-9]* copied \([0-9]*\) summed \([0-9]*\) of \([0-9]*\)\$/\1 \2 \3/p" \
      <<<"$out")
    echo "$name load on dp 2: rank $r copied $copied and summed $summed of $total bytes"
    if [ -z "$total" ] || [ "$copied" -lt $((total * 45 / 100)) ] ||
       [ "$copied" -gt $((total * 55 / 100)) ] || [ "$summed" -gt $((total * 2 / 3)) ]; then
      echo "FAIL: $name: rank $r did not read about its half of the checkpoint alone"
      status=1
    fi
  done
}
if wanted ckpt_zero1; then
  save_out=$(mpirun --oversubscribe -np 2 "$tetra" run "$root/tests/dist/memory.lua" \
    --set train.steps=1 --set train.warmup_steps=1 --set parallel.data_parallel_size=2 \
    --set parallel.zero_stage=1 --set checkpoint.dir="$work/ckpt" 2>&1) ||
    { echo "FAIL: the ZeRO-1 save failed:"; tail -n 20 <<<"$save_out"; status=1; }
  save_peaks ZeRO-1 "$save_out" $((4 * E / 2)) "half an embedding's bytes" $((8 * ONE))
  load_reads ZeRO-1 "$save_out"
fi
# Plain data parallelism on dp 2 (no ZeRO): every rank holds the whole state, yet the
# ranks share the writing (each writes about half of the moments, and its peak must not
# rise: no host copies on the CPU) and the reading (each slice read by one rank and
# broadcast to the other: about half each, where each rank read its whole part before,
# and rank 0 wrote everything).
if wanted ckpt_plain_dp; then
  save_out=$(mpirun --oversubscribe -np 2 "$tetra" run "$root/tests/dist/memory.lua" \
    --set train.steps=1 --set train.warmup_steps=1 --set parallel.data_parallel_size=2 \
    --set parallel.zero_stage=0 --set checkpoint.dir="$work/ckpt0" 2>&1) ||
    { echo "FAIL: the plain data-parallel save failed:"; tail -n 20 <<<"$save_out"; status=1; }
  save_peaks "plain DP" "$save_out" $((4 * E / 2)) "half an embedding's bytes" $((8 * ONE))
  load_reads "plain DP" "$save_out"
fi
# A checkpoint under ZeRO-3 on dp 2 with 8 layers: a save gathers no unit, each parameter
# put together from the shares on the rank that writes it alone, as the moments; beyond
# the host copies it writes, each rank must rise less than half an embedding's bytes
# (measured: 0; gathering each unit whole rose 2.1 layers, 4.7 embeddings). A load reads
# the shares and gathers the units as after an update: it must rise less than three
# layers' bytes, where gathering the whole model (8 layers) at once rose 9.1 layers'.
if wanted ckpt_zero3; then
  save_out=$(mpirun --oversubscribe -np 2 "$tetra" run "$root/tests/dist/memory.lua" \
    --set train.steps=1 --set train.warmup_steps=1 --set parallel.data_parallel_size=2 \
    --set parallel.zero_stage=3 --set model.n_layers=8 --set checkpoint.dir="$work/ckpt3" 2>&1) ||
    { echo "FAIL: the ZeRO-3 save and load failed:"; tail -n 20 <<<"$save_out"; status=1; }
  save_peaks ZeRO-3 "$save_out" $((4 * E / 2)) "half an embedding's bytes" \
    $((12 * (2 * E + 8 * LAYER + FINAL)))
  # Its set-up: AdamW's moments were made whole, 8 bytes a parameter, before ZeRO replaced
  # them by the shards' (4.7 MB at the peak); lazy, they are never allocated: the peak must
  # stay within a layer's bytes of what the rank keeps (measured: 116 KB above).
  for r in 0 1; do
    peak=$(sed -n "s/^setup rank $r peak \([0-9]*\)\$/\1/p" <<<"$save_out")
    read -r params optim < <(sed -n \
      "s/^memory rank $r tp 0 pp 0 params \([0-9]*\) grads [0-9]* optimizer \([0-9]*\)\$/\1 \2/p" \
      <<<"$save_out")
    echo "ZeRO-3 set-up on dp 2, 8 layers: rank $r peaked at $peak bytes, keeps" \
         "$((params + optim))"
    if [ -z "$peak" ] || [ -z "$params" ] || [ "$peak" -ge $((params + optim + 4 * LAYER)) ]; then
      echo "FAIL: the ZeRO-3 set-up held a layer's bytes or more beyond what rank $r keeps"
      status=1
    fi
  done
  load_reads ZeRO-3 "$save_out"
  for r in 0 1; do
    p=$(sed -n "s/^load rank $r peak \([0-9]*\) .*/\1/p" <<<"$save_out")
    echo "ZeRO-3 load on dp 2, 8 layers: rank $r's peak rose $p bytes (a layer $((4 * LAYER)))"
    if [ -z "$p" ] || [ "$p" -ge $((3 * 4 * LAYER)) ]; then
      echo "FAIL: the ZeRO-3 load held three layers' bytes or more at once on rank $r"
      status=1
    fi
  done
fi
[ "$status" = 0 ] && echo PASS
exit "$status"
