#!/usr/bin/env bash
# A checkpoint saved in one layout resumes in any other. The tiny Llama recipe runs 12
# steps in a layout, saving at step 6 (split layouts: each rank the slices it holds and
# index.json; ZeRO-1 and 2: the moments of every shard put together); the run then resumes
# from that checkpoint in other layouts. Steps 7..12 must follow the uninterrupted
# single-process run within 1e-5 relative (loss and grad_norm before clipping): the
# layouts compute the same math in different orders. Resumed in the layout that saved
# it, the continuation must be identical (as text) to the uninterrupted run in that
# layout.
# Usage: bash checkpoint_relayout.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
recipe="$root/recipes/tiny.lua"
# 12 steps (the lr schedule depends on train.steps), 4 layers (room for 2 stages), two
# micro-batches per step (pipelines need them).
common=(--set train.steps=12 --set model.n_layers=4 --set train.gradient_accumulation_steps=2
        --set train.max_grad_norm=0.5)
P=parallel

# sets "a=b c=d" -> --set a=b --set c=d
sets() { local out=() kv; for kv in $1; do out+=(--set "$kv"); done; echo "${out[@]}"; }

run() {   # run NAME NP "settings": one process for NP=1, else mpirun -np NP
  local name="$1" np="$2" layout="$3"; shift 3
  local cmd=("$tetra" run "$recipe" "${common[@]}" $(sets "$layout") "$@"
             --set log.metrics_file="$work/$name.jsonl")
  [ "$np" -gt 1 ] && cmd=(mpirun --oversubscribe -np "$np" "${cmd[@]}")
  if ! timeout -k 10 300 "${cmd[@]}" >"$work/$name.log" 2>&1; then
    echo "FAIL: the $name run failed:"; tail -n 30 "$work/$name.log"; exit 1
  fi
}

# "step":N,"loss":X,"lr":Y,"grad_norm":Z -> N X Z
values() { sed -E 's/.*"step":([0-9]+),"loss":([^,]+),"lr":[^,]+,"grad_norm":([^,]+),.*/\1 \2 \3/' "$1"; }

# compare NAME REF: steps 7..12 of NAME within 1e-5 of REF's
compare() {
  awk -v name="$(basename "$1" .jsonl)" '
    NR == FNR { loss[$1] = $2; norm[$1] = $3; next }
    function rel(a, b) { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; return m > 0 ? d / m : d }
    $1 >= 7 {
      n++
      if (!($1 in loss)) { print name ": step " $1 " missing in the reference"; bad = 1; next }
      r = rel($2, loss[$1]); g = rel($3, norm[$1])
      if (r > w) w = r
      if (g > wg) wg = g
      if (r > 1e-5 || g > 1e-5) { printf "%s step %d: loss rel %.2e, grad_norm rel %.2e\n", name, $1, r, g; bad = 1 }
    }
    END {
      if (n != 6) { print name ": expected steps 7..12, got " n; bad = 1 }
      printf "%-40s steps 7..12: worst loss rel %.2e, grad_norm rel %.2e %s\n", name, w, wg, bad ? "FAIL" : "ok"
      exit bad
    }' <(values "$2") <(values "$1")
}

run single 1 ""
status=0
# save_then_resume TAG NP "saving layout" then NP "resume layout" pairs. TAG names the case
# (TETRA_TEST_CASES, prelude.bash's wanted).
save_then_resume() {
  local tag="$1" np="$2" layout="$3"; shift 3
  stop_if_failed
  wanted "$tag" || return 0
  run "$tag" "$np" "$layout" --set checkpoint.dir="$work/ck_$tag" --set checkpoint.every=6
  local ck="$work/ck_$tag/step_000006"
  [ -f "$ck/state.json" ] || { echo "FAIL: $tag wrote no checkpoint"; ls -R "$work/ck_$tag"; exit 1; }
  compare "$work/$tag.jsonl" "$work/single.jsonl" || status=1
  # The same layout continues bit for bit.
  run "${tag}_again" "$np" "$layout" --set checkpoint.resume="$ck"
  if ! diff <(values "$work/$tag.jsonl" | awk '$1 >= 7') <(values "$work/${tag}_again.jsonl" | awk '$1 >= 7') >/dev/null; then
    echo "FAIL: $tag resumed in its own layout does not continue bit for bit"; status=1
  else
    echo "$tag resumed in its own layout: steps 7..12 identical"
  fi
  while [ $# -ge 2 ]; do
    local rnp="$1" rlayout="$2"; shift 2
    local name="${tag}_to_$(echo "${rlayout:-one}" | tr ' =.' '_-_')"
    run "$name" "$rnp" "$rlayout" --set checkpoint.resume="$ck"
    grep -q "resumed from $ck at step 6" "$work/$name.log" ||
      { echo "FAIL: $name: no 'resumed from' line:"; cat "$work/$name.log"; exit 1; }
    compare "$work/$name.jsonl" "$work/single.jsonl" || status=1
  done
}

save_then_resume tp2 2 "$P.tensor_parallel_size=2" \
  1 "" \
  2 "$P.pipeline_parallel_size=2"
save_then_resume dp2_zero1 2 "$P.data_parallel_size=2 $P.zero_stage=1" \
  1 "" \
  4 "$P.tensor_parallel_size=2 $P.context_parallel_size=2 $P.zero_stage=1" \
  2 "$P.data_parallel_size=2 $P.zero_stage=2"
# ZeRO-2 saves the same shards of the AdamW moments as ZeRO-1 (its gradient shards are
# not state): to one process, to ZeRO-1, and resharded over dp x cp = 4.
save_then_resume dp2_zero2 2 "$P.data_parallel_size=2 $P.zero_stage=2" \
  1 "" \
  2 "$P.data_parallel_size=2 $P.zero_stage=1" \
  4 "$P.context_parallel_size=2 $P.data_parallel_size=2 $P.zero_stage=2"
# ZeRO-3 saves from gathered parameters and loads into them (each rank then keeps its
# share): to one process, to ZeRO-1, and resharded over dp x cp = 4 under ZeRO-3.
save_then_resume dp2_zero3 2 "$P.data_parallel_size=2 $P.zero_stage=3" \
  1 "" \
  2 "$P.data_parallel_size=2 $P.zero_stage=1" \
  4 "$P.context_parallel_size=2 $P.data_parallel_size=2 $P.zero_stage=3"
# Under context parallelism the ZeRO group spans dp x cp: each slice's moments go to its
# writer, the rank of context-parallel rank 0 that the data-parallel share falls to.
save_then_resume cp2_dp2_zero1 4 "$P.context_parallel_size=2 $P.data_parallel_size=2 $P.zero_stage=1" \
  1 ""
# With optimizer offload the shares' moments are host tensors: saved and loaded the same,
# into ZeRO-3 without offload as well.
save_then_resume dp2_zero3_offload 2 "$P.data_parallel_size=2 $P.zero_stage=3 $P.offload_optimizer=true" \
  2 "$P.data_parallel_size=2 $P.zero_stage=3"
# ZeRO-3 in a split layout: each stage's units gathered one at a time, each writing rank's
# shard file from its host copies; resumed under tensor parallelism with ZeRO-3 (the load
# unit by unit into each rank's shares) and on one process.
save_then_resume pp2_dp2_zero3 4 "$P.pipeline_parallel_size=2 $P.data_parallel_size=2 $P.zero_stage=3" \
  1 "" \
  4 "$P.tensor_parallel_size=2 $P.data_parallel_size=2 $P.zero_stage=3"
save_then_resume tp2_pp2_dp2_zero1 8 "$P.tensor_parallel_size=2 $P.pipeline_parallel_size=2 $P.data_parallel_size=2 $P.zero_stage=1" \
  1 "" \
  2 "$P.data_parallel_size=2 $P.zero_stage=1" \
  4 "$P.pipeline_parallel_size=4"
# HF export works from a ZeRO-2 and a ZeRO-3 checkpoint, and gives the very file ZeRO-1's
# gives (the same reduce-scatter, the same update of the same shards). It needs the cases
# dp2_zero1, 2 and 3.
if wanted dp2_zero1 && wanted dp2_zero2 && wanted dp2_zero3; then
  for z in 1 2 3; do
    "$tetra" convert --to hf "$work/ck_dp2_zero$z/step_000006" "$work/hf_zero$z" \
      >"$work/hf_zero$z.log" 2>&1 || { echo "FAIL: HF export of the ZeRO-$z checkpoint:"; cat "$work/hf_zero$z.log"; status=1; }
  done
  for z in 2 3; do
    if cmp -s "$work/hf_zero1/model.safetensors" "$work/hf_zero$z/model.safetensors"; then
      echo "HF export: ZeRO-$z's model.safetensors is ZeRO-1's, byte for byte"
    else
      echo "FAIL: the HF exports of the ZeRO-1 and ZeRO-$z checkpoints differ"; status=1
    fi
  done
fi
[ "$status" = 0 ] && echo PASS
exit "$status"
