#!/usr/bin/env bash
# The deployment guide's YAML (recipes/configs/llama-7b.yaml), as written:
#   - run verbatim on this machine (one process, no bucket credentials, no /data), it
#     stops at once with what is missing: the 64 processes, the s3:// credentials, the
#     tokenizer file; no traceback, nothing big allocated (it runs under an 8 GB
#     address-space limit: the 7B model's 27 GB of weights cannot have been built);
#   - a scaled copy, every key kept and only the values a small machine needs changed (a
#     tiny model through --set, local JSONL and tokenizer paths, folders under a temp
#     dir, 8 processes as dp2 x tp2 x pp2 with ZeRO-1 and sequence parallelism), trains,
#     evaluates, checkpoints and logs through the guide's own keys.
# Usage: bash guide_yaml.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
guide="$root/recipes/configs/llama-7b.yaml"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
source "$root/tests/memory_cap.bash" "$tetra"

# -- Verbatim. -----------------------------------------------------------------------------
t0=$SECONDS
if cap_memory 8000000 env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY "$tetra" run "$guide" \
     >"$work/verbatim.log" 2>&1; then
  cat "$work/verbatim.log"; fail "the guide's YAML ran on one process"
fi
cat "$work/verbatim.log"
for want in "this layout needs 64 processes (data 8 x tensor 2 x pipeline 4 x context 1) but 1 is running" \
            "mpirun -np 64" \
            "data.input_path: s3://data/shards/\*.jsonl: no S3 credentials (set AWS_ACCESS_KEY_ID" \
            "data.vocab_file: /data/tokenizer/tokenizer.json does not exist"; do
  grep -q -- "$want" "$work/verbatim.log" || fail "the verbatim run does not say '$want'"
done
! grep -q "traceback" "$work/verbatim.log" || fail "a traceback"
echo "ok: verbatim: names the processes, the bucket credentials and the tokenizer file ($((SECONDS - t0)) s)"

# -- A scaled copy. ----------------------------------------------------------------------
command -v mpirun >/dev/null || {
  [ "${CI:-}" = true ] && fail "no mpirun (CI=true)"; echo "skipped: no mpirun"; exit 77; }
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$work/corpus"
for k in 0 1; do
  for i in $(seq 1 120); do
    printf '{"text": "shard %d line %d: the guide trains on JSONL shards of plain text %d"}\n' "$k" "$i" $((i * 7 % 13))
  done >"$work/corpus/part-$k.jsonl"
done
"$tetra" tokenizer train --vocab-size 300 --out "$work/tok" "$work/corpus/part-0.jsonl" >"$work/tok.log" 2>&1 ||
  { cat "$work/tok.log"; fail "tokenizer training"; }
# Values only: every key of the guide stays where it is.
sed -e "s|^\(  model_name:\).*|\1 llama-tiny|" \
    -e "s|^\(  batch_size:\).*|\1 16|" \
    -e "s|^\(  gradient_accumulation_steps:\).*|\1 2|" \
    -e "s|^\(  steps:\).*|\1 6|" \
    -e "s|^\(  warmup_steps:\).*|\1 2|" \
    -e "s|^\(  eval_every:\).*|\1 3|" \
    -e "s|^\(  eval_steps:\).*|\1 2|" \
    -e "s|^\(  data_parallel_size:\).*|\1 2|" \
    -e "s|^\(  pipeline_parallel_size:\).*|\1 2|" \
    -e "s|^\(  input_path:\).*|\1 $work/corpus/*.jsonl|" \
    -e "s|^\(  vocab_file:\).*|\1 $work/tok/tokenizer.json|" \
    -e "s|^\(  num_workers:\).*|\1 1|" \
    -e "s|^\(  dir:\).*|\1 $work/ckpt|" \
    -e "s|^\(  every:\) 1000|\1 3|" \
    -e "s|^\(  metrics_file:\).*|\1 $work/logs/metrics.jsonl|" \
    -e "s|^\(  every:\) 10|\1 1|" \
    "$guide" >"$work/scaled.yaml"
diff <(grep -oE '^ *[a-z_]+:' "$guide") <(grep -oE '^ *[a-z_]+:' "$work/scaled.yaml") ||
  fail "the scaled copy lost or added keys"
if ! mpirun --oversubscribe -np 8 "$tetra" run "$work/scaled.yaml" \
     --set model.dim=64 --set model.n_layers=4 --set model.n_heads=4 --set model.n_kv_heads=2 \
     --set model.ffn_hidden=128 --set model.seq_len=32 --set model.vocab_size=300 \
     >"$work/scaled.log" 2>&1; then
  cat "$work/scaled.log"; fail "the scaled copy did not train"
fi
[ "$(wc -l <"$work/logs/metrics.jsonl")" -ge 6 ] || { cat "$work/scaled.log"; fail "no metrics for 6 steps"; }
grep -q '"eval_loss"' "$work/logs/metrics.jsonl" || fail "no evaluation in the metrics"
[ -d "$work/ckpt/step_000006" ] || { ls -R "$work/ckpt"; fail "no step-6 checkpoint"; }
grep -q "$work/corpus/\*.jsonl" "$work/scaled.log" || fail "the start-up summary does not name the data"
echo "ok: the scaled copy (8 processes, dp2 x tp2 x pp2, ZeRO-1, sequence parallel) trained 6 steps, evaluated, checkpointed"
echo PASS
