#!/usr/bin/env bash
# Per-parameter gradients after one step, in every layout of 2, 4 and 8 ranks and in 9
# with the options (ZeRO-1 and 2, SP, tied, interleaved, KV heads on several ranks, an uneven
# vocabulary, GPT-2), against one process: every
# slice a rank counts (its placement's primary copies, tests/dist/grad_check.lua) must
# equal that slice of the single-process gradient, each parameter within 1e-5 relative
# (L2 of the difference over L2 of the single-process slice, or over 1e-3 of the whole
# gradient's norm where the slice is that small: a key bias's gradient is zero in exact
# arithmetic, rounding noise in practice), and together the slices
# must cover every parameter exactly once. A wrong scale, a missing sum over tp or over
# the tied stages, a misplaced shard all show here parameter by parameter, where a loss
# or a global norm can hide them.
# Its cases, for TETRA_TEST_CASES (prelude.bash's wanted), are the names check gives.
# Usage: bash grad_check.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
recipe="$root/tests/dist/grad_check.lua"
common=(--set train.steps=1 --set train.warmup_steps=1 --set train.max_grad_norm=0.5
        --set train.gradient_accumulation_steps=2 --set model.n_layers=4 --set log.progress=false)
gpt2=(--set grad_check.gpt2=true --set model.vocab_size=256 --set model.dim=64
      --set model.n_heads=4 --set model.n_kv_heads=4 --set model.ffn_hidden=128 --set model.seq_len=32)

# check NAME NP "layout settings" "model settings" [args...]: runs one process and the
# layout on the same model (model settings and args go to both) and compares.
check() {
  local name="$1" np="$2" settings="$3" model="$4"; shift 4
  stop_if_failed
  wanted "$name" || return 0
  local sets=() msets=() kv
  for kv in $settings; do sets+=(--set "$kv"); done
  for kv in $model; do msets+=(--set "$kv"); done
  # One single-process reference per model (the same settings give the same gradients).
  local ref="$work/ref_$(echo "$model $*" | md5sum | cut -c1-12)"
  mkdir -p "$work/$name"
  if [ ! -d "$ref" ]; then
    mkdir -p "$ref"
    if ! "$tetra" run "$recipe" "${common[@]}" "$@" "${msets[@]}" --set grad_check.dir="$ref" \
         >"$ref.log" 2>&1; then
      echo "FAIL: $name: the single-process run failed:"; tail -n 20 "$ref.log"; status=1; return
    fi
  fi
  if ! timeout -k 10 120 mpirun --oversubscribe -np "$np" "$tetra" run "$recipe" "${common[@]}" "$@" \
       "${msets[@]}" "${sets[@]}" --set grad_check.dir="$work/$name" >"$work/$name.log" 2>&1; then
    echo "FAIL: $name: the run failed:"; tail -n 20 "$work/$name.log"; status=1; return
  fi
  if ! "$tetra" -e '
    local ref, dir = arg[1], arg[2]
    local st, F = require("tetra.io"), require("tetra").nn.functional
    local host = require("tetra.host")
    local full = st.load(ref .. "/grads_00000.safetensors")
    -- A gradient that is zero in exact arithmetic (a key bias: softmax ignores a shift
    -- that is the same for every key) is rounding noise in both runs: differences are
    -- measured against the slice, or 1e-3 of the whole-model gradient norm if larger.
    local G = 0
    for _, t in pairs(full) do
      local s = require("tetra").sum(require("tetra").mul(t, t)):item()
      G = G + s
    end
    G = math.sqrt(G)
    local covered, worst, worst_name, bad = {}, 0, "", {}
    for _, file in ipairs(host.listdir(dir)) do
      local f = st.open(dir .. "/" .. file)
      local meta = f:metadata()
      for _, name in ipairs(f:names()) do
        local dim, off, len = meta[name]:match("^(%d+):(%d+):(%d+)$")
        dim, off, len = tonumber(dim), tonumber(off), tonumber(len)
        local want = full[name]
        if not want then bad[#bad + 1] = name .. ": not in the single-process model" else
          local ws = F.contiguous(F.narrow(want, dim, off, len))
          local got = f:read(name)
          local d, n = 0, 0
          local a, b = ws:tolist(), got:tolist()
          local function walk(x, y)
            if type(x) == "table" then for i = 1, #x do walk(x[i], y[i]) end
            else d = d + (x - y) ^ 2; n = n + x * x end
          end
          walk(a, b)
          local rel = math.sqrt(d) / math.max(math.sqrt(n), 1e-3 * G)
          if rel > worst then worst, worst_name = rel, name end
          if rel > 1e-5 then bad[#bad + 1] = string.format("%s [%d:%d of dim %d]: rel %.2e", name, off, off + len, dim, rel) end
          covered[name] = (covered[name] or 0) + len
        end
      end
      f:close()
    end
    for name, t in pairs(full) do
      local shape = t:shape()
      local dims = {}
      for _, file in ipairs(host.listdir(dir)) do
        local f = st.open(dir .. "/" .. file); local m = f:metadata()[name]; f:close()
        if m then dims[tonumber(m:match("^(%d+)"))] = true end
      end
      local dim = next(dims) or 0
      if (covered[name] or 0) ~= shape[dim + 1] then
        bad[#bad + 1] = string.format("%s: slices cover %d of %d rows", name, covered[name] or 0, shape[dim + 1])
      end
    end
    print(string.format("worst relative difference %.2e (%s)", worst, worst_name))
    for _, b in ipairs(bad) do print("  " .. b) end
    os.exit(#bad == 0 and 0 or 1)' "$ref" "$work/$name" >"$work/$name.cmp" 2>&1; then
    echo "FAIL: $name:"; cat "$work/$name.cmp"; status=1; return
  fi
  echo "$name: $(cat "$work/$name.cmp")"
}

status=0
P=parallel
check tp2 2 "$P.tensor_parallel_size=2" ""
check cp2_dp2 4 "$P.context_parallel_size=2 $P.data_parallel_size=2" ""
check pp2_tied 2 "$P.pipeline_parallel_size=2" "model.tie_embeddings=true"
check tp4_kv2_sp 4 "$P.tensor_parallel_size=4 $P.sequence_parallel=true" ""
check dp2_zero1 2 "$P.data_parallel_size=2 $P.zero_stage=1" ""
check tp2_cp2_pp2_zero1 8 "$P.tensor_parallel_size=2 $P.context_parallel_size=2 $P.pipeline_parallel_size=2 $P.zero_stage=1" ""
check cp2_dp2_zero2 4 "$P.context_parallel_size=2 $P.data_parallel_size=2 $P.zero_stage=2" ""
check tp2_pp2_v2_tied 4 "$P.tensor_parallel_size=2 $P.pipeline_parallel_size=2 $P.virtual_pipeline_size=2 $P.pipeline_schedule=interleaved_1f1b" "model.tie_embeddings=true"
check gpt2_tp2_sp_pp2 4 "$P.tensor_parallel_size=2 $P.sequence_parallel=true $P.pipeline_parallel_size=2" "" "${gpt2[@]}"
check gpt2_tp4_vocab250_dp2_zero1 8 "$P.tensor_parallel_size=4 $P.data_parallel_size=2 $P.zero_stage=1" "model.vocab_size=250" "${gpt2[@]}"
# A vocabulary of 2,048 for 256 tokens a step, the row exchange on: the embedding's
# gradient travels as the rows some DP rank touched (engine/dist/reducer.c), not the
# whole table.
sparse_checks=(dp2_sparse_rows dp2_zero1_sparse_rows dp2_zero2_sparse_rows tp2_dp2_sparse_rows pp2_dp2_sparse_rows)
check dp2_sparse_rows 2 "$P.data_parallel_size=2" "model.vocab_size=2048 dist.sparse_embedding_grad=true"
check dp2_zero1_sparse_rows 2 "$P.data_parallel_size=2 $P.zero_stage=1" "model.vocab_size=2048 dist.sparse_embedding_grad=true"
check dp2_zero2_sparse_rows 2 "$P.data_parallel_size=2 $P.zero_stage=2" "model.vocab_size=2048 dist.sparse_embedding_grad=true"
check tp2_dp2_sparse_rows 4 "$P.tensor_parallel_size=2 $P.data_parallel_size=2" "model.vocab_size=2048 dist.sparse_embedding_grad=true"
check pp2_dp2_sparse_rows 4 "$P.pipeline_parallel_size=2 $P.data_parallel_size=2" "model.vocab_size=2048 dist.sparse_embedding_grad=true"
for name in "${sparse_checks[@]}"; do
  wanted "$name" || continue
  if ! grep -qE '^sparse embedding rows: [0-9]+$' "$work/$name.log"; then
    echo "FAIL: $name: the embedding's gradient did not travel as rows:"
    grep 'sparse embedding rows' "$work/$name.log"; status=1
  fi
done
# Data parallelism computes the first blocks' weight gradients after the embedding's
# (dist.defer_weight_grads), and its buckets must follow the order backward then produces
# the gradients in: no bucket may wait for an earlier one (rank 0 prints the count).
for name in dp2_zero1 cp2_dp2 gpt2_tp4_vocab250_dp2_zero1; do
  wanted "$name" || continue
  if ! grep -qE '^buckets held: 0, deferred: [1-9][0-9]*$' "$work/$name.log"; then
    echo "FAIL: $name: gradients deferred and buckets in backward's order expected:"
    grep 'buckets held' "$work/$name.log"; status=1
  fi
done
# Every layout of 2, 4 and 8 ranks over (tp, cp, dp, pp), on a Llama every size divides
# (as tests/dist/layouts.txt's grid).
grid="model.n_layers=8 model.n_heads=8 model.n_kv_heads=8 model.ffn_hidden=128 train.batch_size=16"
for np in 2 4 8; do
  for tp in 1 2 4 8; do for cp in 1 2 4 8; do for dp in 1 2 4 8; do for pp in 1 2 4 8; do
    [ $((tp * cp * dp * pp)) -eq "$np" ] || continue
    check "grid_tp${tp}_cp${cp}_dp${dp}_pp${pp}" "$np" \
      "$P.tensor_parallel_size=$tp $P.context_parallel_size=$cp $P.data_parallel_size=$dp $P.pipeline_parallel_size=$pp" \
      "$grid"
  done; done; done; done
done
if grep -hE '^buckets held: [1-9]' "$work"/*.log; then
  echo "FAIL: some layout's gradient buckets waited for an earlier one (above)"; status=1
fi
[ "$status" = 0 ] && echo PASS
exit "$status"
