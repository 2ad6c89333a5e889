#!/bin/bash
# Bad input found by a sweep of `tetra run` over wrong values, files of the wrong shape and
# unreadable data: each is one line naming the key, file or line and the fix, with a
# non-zero exit, never a Lua traceback or a hang. (cli/config holds the first checks of
# the kind; this file stops at its first failure under TETRA_TEST_STOP_AT_FAILURE.)
TETRA=${1:?usage: bad_input.sh /path/to/tetra}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
TINY=$SRC/recipes/configs/tiny.yaml
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
fail() {
  echo "FAIL: $*"; fails=$((fails + 1))
  [ -n "${TETRA_TEST_STOP_AT_FAILURE:-}" ] && exit 1
}

check_error() {  # expected-substring args... (of tetra run; one step at most, should it run)
  local want=$1; shift
  local err; err=$(env -u OMPI_COMM_WORLD_SIZE timeout 60 "$TETRA" run "$@" --set train.steps=1 \
                   --set train.warmup_steps=0 2>&1 >/dev/null); local rc=$?
  [ $rc -eq 1 ] || fail "tetra run $* exited $rc, expected 1 (124: it hung)"
  [ "$(wc -l <<<"$err")" -eq 1 ] || fail "tetra run $*: expected one line, got: $err"
  grep -qF -- "$want" <<<"$err" || fail "tetra run $*: expected '$want', got: $err"
}

# Values the schema's types and bounds let through.
check_error "config error: model.rope_theta must be > 0, got 0" "$TINY" --set model.rope_theta=0
check_error "config error: optim.beta1 must be below 1, got 1" "$TINY" --set optim.beta1=1
check_error "config error: optim.beta2 must be below 1, got 1.5" "$TINY" --set optim.beta2=1.5
# A key only another precision or optimizer reads would change nothing.
check_error "config error: train.loss_scale_init applies to train.precision=fp16 (this run's is bf16)" \
  "$TINY" --set train.precision=bf16 --set train.loss_scale_init=1024
check_error "config error: optim.momentum applies to optim.name=sgd (this run's is adamw)" \
  "$TINY" --set optim.momentum=0.5
check_error "config error: train.model_name ('llama-tiny') and model.name ('gpt2-124m') name different presets" \
  "$TINY" --set model.name=gpt2-124m
check_error "config error: no training data: set data.input_path" "$TINY" --set data.mock=false
check_error "config error: train.model_name must be a preset name, got a table" \
  "$TINY" --set 'train.model_name=[llama-tiny]'
# train.recipe from --set picks a YAML config's recipe; a Lua recipe is its own.
check_error "config error: train.recipe: recipe 'no_such_recipe' not found" \
  "$TINY" --set train.recipe=no_such_recipe
check_error "is itself a recipe: drop --set train.recipe" "$SRC/recipes/llama.lua" --set train.recipe=gpt2

# model.family picks the recipe of a YAML config that names no preset (it built a Llama);
# a recipe told of another family refuses.
printf 'model:\n  family: gpt2\n  dim: 64\n  n_layers: 1\n  n_heads: 2\n  vocab_size: 256\n  seq_len: 32\n' \
  >"$tmp/gpt2_keys.yaml"
out=$(timeout 60 "$TETRA" run "$tmp/gpt2_keys.yaml" --set train.steps=1 --set train.warmup_steps=0 \
      --set train.sample_tokens=0 --set data.mock=true 2>&1); rc=$?
[ $rc -eq 0 ] || fail "model.family=gpt2 YAML exited $rc: $out"
grep -q '^gpt2: ' <<<"$out" || fail "model.family=gpt2 YAML built another model: $out"
check_error "config error: model.family is llama but recipe gpt2 builds a gpt2 model" \
  "$SRC/recipes/gpt2.lua" --set model.family=llama
check_error "config error: model.family must be one of gpt2, llama, qwen2, got 'bogus'" \
  "$tmp/gpt2_keys.yaml" --set model.family=bogus

# YAML files of another shape, or with a key given twice.
printf 'train: 5\n' >"$tmp/scalar.yaml"
check_error "scalar.yaml: 'train' must be a section of key: value pairs, got 5" "$tmp/scalar.yaml"
printf -- '- train\n- data\n' >"$tmp/list.yaml"
check_error "list.yaml: expected a mapping of sections" "$tmp/list.yaml"
printf 'train:\n  lr: 3.0e-4\n  steps: 10\n  lr: 1.0e-3\n' >"$tmp/twice.yaml"
check_error "twice.yaml: key 'lr' appears twice in one mapping at line 4" "$tmp/twice.yaml"
printf 'train:\n  lr: 3.0e-4\n---\ntrain:\n  lr: 1.0e-3\n' >"$tmp/two_docs.yaml"
check_error "two_docs.yaml: a second YAML document (one config is one document) at line 3" "$tmp/two_docs.yaml"

# A batch of a billion rows does not fit: said at once, on one rank and as rank 0 of 64
# (the search for a change that fits replayed a billion micro-batches).
err=$(timeout 10 "$TETRA" run "$TINY" --set train.batch_size=1e9 2>&1); rc=$?
[ $rc -eq 1 ] || fail "a billion rows exited $rc (124: it hung): $err"
grep -qF "config error: this layout needs about" <<<"$err" || fail "a billion rows: $err"
err=$(OMPI_COMM_WORLD_SIZE=64 OMPI_COMM_WORLD_RANK=0 timeout 20 "$TETRA" run "$TINY" \
      --set model.n_layers=8 --set parallel.data_parallel_size=64 --set train.batch_size=1024000000 2>&1); rc=$?
[ $rc -eq 1 ] || fail "a billion rows on dp 64 exited $rc (124: it hung): $err"
grep -qF "config error: this layout needs about" <<<"$err" || fail "a billion rows on dp 64: $err"
# A billion micro-batches a step (the planner extends a steady-state replay).
err=$(timeout 10 "$TETRA" run "$TINY" --set train.batch_size=1e9 --set train.gradient_accumulation_steps=1e9 \
      --set train.device_memory_gib=0.001 2>&1); rc=$?
[ $rc -eq 1 ] || fail "a billion micro-batches exited $rc (124: it hung): $err"
grep -qF "config error: this layout needs about" <<<"$err" || fail "a billion micro-batches: $err"

# data.datasets, a weighted blend, trains; a misspelt key of an entry is refused; a data
# problem found while reading (a JSONL line without the text field) is one line.
B=(--set train.steps=1 --set train.warmup_steps=0 --set log.every=1 --set model.n_layers=1
   --set train.sample_tokens=0 --set data.shuffle_buffer_size=16 --set data.mock=false)
for i in $(seq 100); do echo "line $i of the first source"; done >"$tmp/a.txt"
for i in $(seq 100); do echo "{\"text\": \"document $i of the second\"}"; done >"$tmp/b.jsonl"
out=$(timeout 60 "$TETRA" run "$TINY" "${B[@]}" \
      --set "data.datasets=[{path: $tmp/a.txt, weight: 3}, {path: $tmp/b.jsonl}]" 2>&1); rc=$?
[ $rc -eq 0 ] || fail "data.datasets run exited $rc: $out"
grep -qF "data: $tmp/a.txt (weight 3), $tmp/b.jsonl (weight 1)" <<<"$out" || fail "data.datasets summary: $out"
grep -qE '^step +1/1 \| loss [0-9]' <<<"$out" || fail "data.datasets run took no step: $out"
check_error "data: data.datasets[1]: unknown key 'weigth'" "$TINY" "${B[@]}" \
  --set "data.datasets=[{path: $tmp/a.txt, weigth: 3}]"
check_error "data: data.datasets[2].weight: expected a number > 0, got 0" "$TINY" "${B[@]}" \
  --set "data.datasets=[{path: $tmp/a.txt}, {path: $tmp/b.jsonl, weight: 0}]"
check_error "config error: data.input_path and data.datasets are both set" "$TINY" "${B[@]}" \
  --set data.input_path="$tmp/a.txt" --set "data.datasets=[{path: $tmp/a.txt}]"
echo '{"body": "no text field"}' >"$tmp/nofield.jsonl"
check_error "data: $tmp/nofield.jsonl:1: no string field \"text\" (set data.text_field)" \
  "$TINY" "${B[@]}" --set data.input_path="$tmp/nofield.jsonl"
check_error "config error: model.vocab_size (100) must be at least 256 for byte-level text" \
  "$TINY" "${B[@]}" --set data.input_path="$tmp/a.txt" --set model.vocab_size=100
# A missing file is named by its key. The evaluation data opens at the start (it opened at
# the first evaluation, and a missing one was a traceback after train.eval_every steps).
check_error "data: data.eval_path: data path '$tmp/none' matches no file" "$TINY" "${B[@]}" \
  --set data.input_path="$tmp/a.txt" --set data.eval_path="$tmp/none" --set train.eval_every=1
check_error "data: data.datasets[2]: data path '$tmp/none' matches no file" "$TINY" "${B[@]}" \
  --set "data.datasets=[{path: $tmp/a.txt}, {path: $tmp/none}]"
check_error "data: data.tokenizer: $tmp/none.json: cannot open: No such file or directory (it takes byte," \
  "$TINY" "${B[@]}" --set data.input_path="$tmp/a.txt" --set data.tokenizer="$tmp/none.json"
check_error "data: data.vocab_file: $tmp/none/vocab.json: cannot open" "$TINY" "${B[@]}" \
  --set data.input_path="$tmp/a.txt" --set data.vocab_file="$tmp/none/vocab.json"

# Steps to trace past the run's end would trace nothing.
check_error 'config error: log.trace_steps = "5:9": the run has 1 steps (train.steps), so no step would be traced' \
  "$TINY" --set log.trace_steps=5:9 --set log.trace_dir="$tmp/trace"
# A checkpoint folder that cannot be made stops the run at its start (it was made at the
# first save: checkpoint.dir alone saved nothing, and with checkpoint.every at the end).
touch "$tmp/file"
check_error "checkpoint.dir: cannot create the folder $tmp/file/ck: Not a directory" "$TINY" \
  --set checkpoint.dir="$tmp/file/ck" --set checkpoint.every=1
out=$(timeout 60 "$TETRA" run "$TINY" --set train.steps=1 --set train.warmup_steps=0 \
      --set log.every=1 --set checkpoint.dir="$tmp/file/ck" 2>/dev/null)
grep -q '^step ' <<<"$out" && fail "an unwritable checkpoint.dir was found after training: $out"

# An unwritable trace folder stops the run at its start.
touch "$tmp/file"
check_error "log.trace_dir: cannot create the folder $tmp/file/trace" "$TINY" "${B[@]}" \
  --set data.input_path="$tmp/a.txt" --set log.trace_steps=1 --set log.trace_dir="$tmp/file/trace"

[ $fails -eq 0 ] && echo "bad_input: all checks passed"
exit $((fails > 0))
