#!/bin/bash
# Hugging Face interop against transformers 4.40 on PyTorch (tools/setup-hf-refs):
#  - export: tiny Llamas (grouped-query, odd sizes; untied and tied), a tiny GPT-2 and a
#    tiny Qwen2 (recipes/qwen2/: q/k/v biases) trained 3 steps with checkpoints, converted with `tetra convert --to hf` (one of them
#    sharded), load with from_pretrained; logits and loss on the same tokens within 1e-4
#    relative of Tetra's (tests/cli/hf_forward.lua);
#  - import: random models saved by save_pretrained (sharded and not, and in bf16 and
#    f16) converted with --from hf, and started directly with model.init_from=hf:DIR,
#    give transformers' logits and loss; training starts from them;
#  - export then import gives back every parameter bit for bit (also through
#    --rope-layout meta, whose q/k rows must be transformers' permutation of Meta's), and
#    import then export every tensor transformers saved;
#  - bad folders and contradicting settings: one line naming the file and the tensor or
#    key, non-zero exit.
TETRA=${1:?usage: hf_convert.sh /path/to/tetra}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PY=${HF_PYTHON:-$root/.deps/venv-hf/bin/python3}
if ! "$PY" -c 'import torch, transformers' 2>/dev/null; then
  echo "no transformers in $PY (run tools/setup-hf-refs)"
  [ "${CI:-}" = true ] && exit 1
  exit 77
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
export TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
fail() { echo "FAIL: $*"; exit 1; }
ref() { "$PY" "$here/hf_reference.py" "$@" || fail "hf_reference.py $1"; }
forward() {   # RECIPE SOURCE OUT [k=v ...]
  local recipe=$1 source=$2 out=$3; shift 3
  "$TETRA" -e 'dofile(arg[1])' "$here/hf_forward.lua" "$root/recipes/$recipe/model.lua" "$source" \
    tokens.st "$out" "$@" >/dev/null || fail "tetra forward from $source"
}
train() {     # NAME RECIPE [--set ...]
  local name=$1 recipe=$2; shift 2
  "$TETRA" run "$root/recipes/$recipe/model.lua" --set train.steps=3 --set train.batch_size=2 \
    --set train.warmup_steps=1 --set checkpoint.dir="$name" --set checkpoint.every=3 \
    "$@" >/dev/null || fail "training $name"
}
convert() { "$TETRA" convert "$@" >/dev/null || fail "tetra convert $*"; }
# One line on stderr matching PATTERN and a non-zero exit.
refused() {   # PATTERN CMD...
  local pattern=$1; shift
  "$@" >out.txt 2>err.txt && fail "accepted: $*"
  [ "$(wc -l <err.txt)" = 1 ] || { cat err.txt; fail "not one line: $*"; }
  grep -qE -- "$pattern" err.txt || { cat err.txt; fail "message of '$*' lacks /$pattern/"; }
  echo "refused: $(cat err.txt)"
}

# The Python side runs three times (importing torch takes seconds): the inputs first,
# every comparison once Tetra has written its side, then the damaged folders.
ref tokens tokens.st 16 97 1 + random llama r_llama 20KB llama-tied r_llama_tied - \
  gpt2 r_gpt2 20KB gpt2 r_gpt2_one - qwen2 r_qwen2 20KB + cast r_llama r_llama_bf16 bfloat16 r_gpt2_one r_gpt2_f16 float16
compares=()

# -- Export -------------------------------------------------------------------------------
llama=(--set model.dim=48 --set model.n_heads=6 --set model.n_kv_heads=2 --set model.n_layers=2
       --set model.vocab_size=101 --set model.ffn_hidden=70 --set model.seq_len=16)
train llama llama "${llama[@]}"
train llama_tied llama "${llama[@]}" --set model.tie_embeddings=true --set model.rope_theta=5000
train gpt2 gpt2 --set model.dim=40 --set model.n_heads=5 --set model.n_layers=2 \
  --set model.vocab_size=97 --set model.ffn_hidden=72 --set model.seq_len=16
train qwen2 qwen2 "${llama[@]}" --set model.rope_theta=20000 --set model.norm_eps=1e-5
# Tensor-parallel checkpoints hold slices: the export puts each parameter together.
if command -v mpirun >/dev/null; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
    mpirun --oversubscribe -np 2 "$TETRA" run "$root/recipes/llama.lua" --set train.steps=3 \
    --set train.batch_size=2 --set train.warmup_steps=1 --set checkpoint.dir=llama_tp \
    --set checkpoint.every=3 --set parallel.tensor_parallel_size=2 "${llama[@]}" >/dev/null ||
    fail "training with tensor_parallel_size=2"
  [ -f llama_tp/step_000003/index.json ] || fail "the tp=2 checkpoint has no index.json"
  convert --to hf llama_tp hf_llama_tp
  forward llama llama_tp tetra_llama_tp.st
  compares+=(hf_llama_tp tokens.st tetra_llama_tp.st)
elif [ "${CI:-}" = true ]; then
  fail "no mpirun (CI=true)"
fi
convert --to hf llama hf_llama --max-shard-size 30KB
[ -f hf_llama/model.safetensors.index.json ] && [ -f hf_llama/model-00007-of-00007.safetensors ] ||
  fail "30KB shards: $(ls hf_llama)"
convert --to hf llama_tied/step_000003 hf_llama_tied
convert --to hf gpt2 hf_gpt2
convert --to hf qwen2 hf_qwen2
for m in llama llama_tied gpt2 qwen2; do forward "${m%_tied}" "$m" "tetra_$m.st"; done
compares+=(hf_llama tokens.st tetra_llama.st hf_llama_tied tokens.st tetra_llama_tied.st
           hf_gpt2 tokens.st tetra_gpt2.st hf_qwen2 tokens.st tetra_qwen2.st)

# Round trips: every parameter bit for bit.
convert --from hf hf_llama back_llama
convert --from hf hf_llama_tied back_llama_tied
convert --from hf hf_gpt2 back_gpt2
convert --from hf hf_qwen2 back_qwen2
convert --to hf llama hf_meta --rope-layout meta
convert --from hf hf_meta back_meta --rope-layout meta
convert --to hf qwen2 hf_qwen2_meta --rope-layout meta
convert --from hf hf_qwen2_meta back_qwen2_meta --rope-layout meta
same=(llama/step_000003/model.safetensors back_llama/model.safetensors
      llama_tied/step_000003/model.safetensors back_llama_tied/model.safetensors
      gpt2/step_000003/model.safetensors back_gpt2/model.safetensors
      qwen2/step_000003/model.safetensors back_qwen2/model.safetensors
      llama/step_000003/model.safetensors back_meta/model.safetensors
      qwen2/step_000003/model.safetensors back_qwen2_meta/model.safetensors)

# -- Import -------------------------------------------------------------------------------
for m in llama llama_tied gpt2 qwen2 llama_bf16 gpt2_f16; do
  recipe=${m%%_*}
  convert --from hf "r_$m" "ck_$m"
  forward "$recipe" "ck_$m" "tetra_ck_$m.st"
  forward "$recipe" "hf:r_$m" "tetra_hf_$m.st"
done
# And the other way round: transformers' tensors come back bit for bit.
for m in llama llama_tied gpt2 qwen2; do convert --to hf "ck_$m" "rt_$m"; same+=("r_$m" "rt_$m"); done
compares+=(r_llama tokens.st tetra_ck_llama.st r_llama tokens.st tetra_hf_llama.st
           r_llama_tied tokens.st tetra_ck_llama_tied.st r_llama_tied tokens.st tetra_hf_llama_tied.st
           r_gpt2 tokens.st tetra_ck_gpt2.st r_gpt2 tokens.st tetra_hf_gpt2.st
           r_qwen2 tokens.st tetra_ck_qwen2.st r_qwen2 tokens.st tetra_hf_qwen2.st
           r_llama_bf16 tokens.st tetra_ck_llama_bf16.st r_gpt2_f16 tokens.st tetra_hf_gpt2_f16.st)
ref compare "${compares[@]}" + same "${same[@]}" + meta hf_llama hf_meta 6 2 \
  hf_qwen2 hf_qwen2_meta 6 2

# Training starts from the imported weights, the same from hf:DIR and the checkpoint.
first_loss() {   # SOURCE TAG [LAUNCHER...]: the first step's loss
  local source=$1 tag=$2; shift 2
  "$@" "$TETRA" run "$root/recipes/llama.lua" --set model.init_from="$source" --set train.steps=2 \
    --set train.batch_size=2 --set model.seq_len=16 --set train.warmup_steps=1 \
    --set parallel.tensor_parallel_size="${TP:-1}" --set parallel.data_parallel_size="${DP:-1}" \
    --set parallel.zero_stage="${ZERO:-0}" --set log.metrics_file="m_$tag.jsonl" \
    >/dev/null || fail "training from $source"
  sed -n 's/.*"loss":\([-0-9.e]*\).*/\1/p' "m_$tag.jsonl" | head -1
}
a=$(first_loss hf:r_llama hf); b=$(first_loss ck_llama ck)
[ -n "$a" ] && [ "$a" = "$b" ] || fail "first loss from hf:DIR ($a) and its checkpoint ($b) differ"
if command -v mpirun >/dev/null; then   # the whole model loads, then the plan splits it
  d=$(TP=2 first_loss hf:r_llama tp2 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2)
  awk -v a="$a" -v d="$d" 'BEGIN { r = (a - d) / a; exit !(d != "" && r < 1e-6 && r > -1e-6) }' ||
    fail "first loss from hf:DIR with tensor_parallel_size=2 ($d) is not one process's ($a)"
  # From the checkpoint each rank reads its own part once the model is split: tp 2, and
  # dp 2 under ZeRO-3 (the shares alone).
  for layout in "2 1 0 ck_tp2" "1 2 3 ck_zero3"; do
    read -r tp dp zero tag <<<"$layout"
    d=$(TP=$tp DP=$dp ZERO=$zero first_loss ck_llama "$tag" env OMPI_ALLOW_RUN_AS_ROOT=1 \
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2)
    awk -v a="$a" -v d="$d" 'BEGIN { r = (a - d) / a; exit !(d != "" && r < 1e-6 && r > -1e-6) }' ||
      fail "first loss from the checkpoint with tp $tp, dp $dp, ZeRO $zero ($d) is not one process's ($a)"
  done
fi
c=$("$TETRA" -e 'print(math.log(97))')
echo "training from r_llama: first loss $a (ln 97 = $c)"

# -- Refused ------------------------------------------------------------------------------
refused "model.dim=64 contradicts model.init_from=hf:r_llama" \
  "$TETRA" run "$root/recipes/llama.lua" --set model.init_from=hf:r_llama --set model.dim=64
refused "r_llama is a Hugging Face folder, not a Tetra checkpoint: write model.init_from=hf:r_llama" \
  "$TETRA" run "$root/recipes/llama.lua" --set model.init_from=r_llama
refused "model.seq_len=16 contradicts model.init_from=hf:r_gpt2, whose model has seq_len = 24" \
  "$TETRA" run "$root/recipes/gpt2.lua" --set model.init_from=hf:r_gpt2 --set model.seq_len=16
refused "holds a gpt2 model but recipe llama" \
  "$TETRA" run "$root/recipes/llama.lua" --set model.init_from=hf:r_gpt2
refused "holds a qwen2 model but recipe llama builds a llama: run recipes/qwen2/model.lua" \
  "$TETRA" run "$root/recipes/llama.lua" --set model.init_from=hf:r_qwen2
refused "holds a llama model but recipe qwen2 builds a qwen2" \
  "$TETRA" run "$root/recipes/qwen2/model.lua" --set model.init_from=hf:r_llama
rm -rf bad_window; cp -r r_qwen2 bad_window
sed -i 's/"use_sliding_window": false/"use_sliding_window": true/' bad_window/config.json
refused "bad_window/config.json: use_sliding_window = true is not supported" \
  "$TETRA" convert --from hf bad_window o10
refused "weights only.*model.init_from" \
  "$TETRA" run "$root/recipes/llama.lua" --set checkpoint.resume=ck_llama --set model.vocab_size=97 \
  --set model.dim=48 --set model.n_heads=6 --set model.n_kv_heads=2 --set model.ffn_hidden=70
f=model.safetensors
for b in trunc long f64 i8 miss extra huge; do rm -rf "bad_$b"; cp -r r_gpt2_one "bad_$b"; done
ref edit bad_f64/$f cast transformer.h.1.mlp.c_fc.weight float64 \
  bad_i8/$f cast transformer.wpe.weight int8 \
  bad_miss/$f drop transformer.h.0.attn.c_proj.bias - \
  bad_extra/$f add transformer.h.0.attn.rotary.weight -
truncate -s -64 bad_trunc/$f
refused "bad_trunc/$f: tensor '[^']+'.*outside" "$TETRA" convert --from hf bad_trunc o1
head -c 64 /dev/zero >>bad_long/$f
refused "bad_long/$f: 64 bytes follow" "$TETRA" convert --from hf bad_long o2
refused "bad_f64/$f: tensor 'transformer.h.1.mlp.c_fc.weight' has dtype F64: expected F32, BF16 or F16" \
  "$TETRA" convert --from hf bad_f64 o3
refused "bad_i8/$f: tensor 'transformer.wpe.weight' has dtype I8" "$TETRA" convert --from hf bad_i8 o4
refused "bad_miss/$f: tensor 'transformer.h.0.attn.c_proj.bias' is missing" "$TETRA" convert --from hf bad_miss o5
refused "bad_extra/$f: tensor 'transformer.h.0.attn.rotary.weight' is not part of a gpt2 model" \
  "$TETRA" convert --from hf bad_extra o6
sed -i 's/"n_embd": 40/"n_embd": 1e300/' bad_huge/config.json
refused "bad_huge/config.json: n_embd must be a positive integer" "$TETRA" convert --from hf bad_huge o7
rm -rf bad_up; cp -r r_gpt2 bad_up
sed -i 's/"transformer.wte.weight": "model-[0-9]*-of-[0-9]*.safetensors"/"transformer.wte.weight": "..\/r_gpt2_one\/model.safetensors"/' \
  bad_up/model.safetensors.index.json
refused "bad_up/model.safetensors.index.json: tensor 'transformer.wte.weight' maps to ../r_gpt2_one" \
  "$TETRA" convert --from hf bad_up o8
rm -rf bad_pickle; mkdir bad_pickle; cp r_gpt2_one/config.json bad_pickle/; echo x >bad_pickle/pytorch_model.bin
refused "bad_pickle has no model.safetensors.*pickles" "$TETRA" convert --from hf bad_pickle o9
refused "hf_llama already exists" "$TETRA" convert --from hf r_llama hf_llama
[ ! -e o1 ] && [ ! -e o1.tmp ] && [ ! -e o10 ] || fail "a refused conversion left output behind"
for args in "--to gguf llama x" "--from hf r_llama" "--to hf llama x --max-shard-size 5XB" \
            "--from hf r_llama x --rope-layout gptj" "--to hf llama x --shard"; do
  # shellcheck disable=SC2086
  "$TETRA" convert $args >out.txt 2>err.txt; rc=$?
  [ "$rc" = 2 ] && [ "$(wc -l <err.txt)" = 1 ] || { cat err.txt; fail "convert $args: exit $rc"; }
done
echo "hf_convert: ok"
