-- Published training runs that `tetra plan --published` (and tests/lua/plan_spec.lua)
-- compare the planner against. Each row: the model, the cluster, the published layout
-- sizes, the global batch and what was measured. The planner predicts its best layout
-- with those sizes (micro-batch, schedule, ZeRO-1 and sequence parallelism free), on the
-- h100 preset; the rows are described in docs/planner.md with their sources.
--   megatron_weak: NVIDIA/Megatron-LM README, "Performance" section, images/model_table.png
--     (GPT models, vocabulary 131,072, sequence 4,096, H100 80GB, bf16; MFU column).
--   megatron_strong: the same README: "strong scaled the standard GPT-3 model ... from 96
--     H100 GPUs to 4608 GPUs, using the same batch size of 1152 sequences throughout ...
--     a reduction in MFU from 47% to 42%" (the 177B model of the table: tp 8, pp 6).
--   torchtitan: pytorch/torchtitan docs/performance.md (now
--     benchmarks/llama3_h100_202412_torchtitan.md), Llama 3.1 on H100 (96 GB HBM2e,
--     400 Gb/s per GPU, 500 W: the h100_500w preset), TPS/GPU; Table 1 and 3 FSDP
--     without torch.compile, local batch 2, selective (per-op) activation checkpointing.
local M = {}

local function gpt(dim, layers, heads)
  return { family = "gpt2", dim = dim, n_layers = layers, n_heads = heads, n_kv_heads = heads,
           ffn_hidden = 4 * dim, vocab_size = 131072, seq_len = 4096, norm_eps = 1e-5 }
end

local llama3_8b = { family = "llama", dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 8,
                    ffn_hidden = 14336, vocab_size = 128256, seq_len = 8192, norm_eps = 1e-5 }

-- A torchtitan row of Tables 1 and 3: Llama 3.1 8B on `gpus` H100 at 500 W, FSDP, local
-- batch 2, per-op selective activation checkpointing; eager PyTorch unless `compiled`
-- (torch.compile fuses the elementwise kernels: the torchtitan_compile engine).
local function titan(name, gpus, tps, compiled)
  return { source = "torchtitan", engine = compiled and "torchtitan_compile" or "torchtitan",
           name = name, model = llama3_8b, tp = 1, pp = 1, dp = gpus, batch = 2 * gpus,
           micro_batch = 2, cluster = "h100_500w", recompute = "selective_op",
           metric = "tps_per_device", value = tps }
end

-- metric: "mfu" (a fraction) or "tps_per_device" (tokens/s per GPU).
M.rows = {
  { source = "megatron_weak", name = "GPT 1.7B, 48 GPUs", model = gpt(2048, 24, 16),
    tp = 1, pp = 1, dp = 48, batch = 192, metric = "mfu", value = 0.41 },
  { source = "megatron_weak", name = "GPT 7.1B, 96 GPUs", model = gpt(4096, 30, 32),
    tp = 2, pp = 1, dp = 48, batch = 192, metric = "mfu", value = 0.47 },
  { source = "megatron_weak", name = "GPT 16B, 192 GPUs", model = gpt(6144, 32, 48),
    tp = 4, pp = 1, dp = 48, batch = 192, metric = "mfu", value = 0.49 },
  { source = "megatron_weak", name = "GPT 32B, 384 GPUs", model = gpt(7168, 48, 56),
    tp = 8, pp = 1, dp = 48, batch = 192, metric = "mfu", value = 0.46 },
  { source = "megatron_weak", name = "GPT 70B, 768 GPUs", model = gpt(8192, 84, 64),
    tp = 8, pp = 2, dp = 48, batch = 384, metric = "mfu", value = 0.42 },
  { source = "megatron_weak", name = "GPT 119B, 1536 GPUs", model = gpt(10240, 92, 80),
    tp = 8, pp = 4, dp = 48, batch = 768, metric = "mfu", value = 0.43 },
  { source = "megatron_weak", name = "GPT 177B, 2304 GPUs", model = gpt(12288, 96, 96),
    tp = 8, pp = 6, dp = 48, batch = 1152, metric = "mfu", value = 0.44 },
  { source = "megatron_weak", name = "GPT 314B, 3072 GPUs", model = gpt(16384, 96, 128),
    tp = 8, pp = 8, dp = 48, batch = 1536, metric = "mfu", value = 0.48 },
  { source = "megatron_weak", name = "GPT 462B, 6144 GPUs", model = gpt(18432, 112, 144),
    tp = 8, pp = 16, dp = 48, batch = 3072, metric = "mfu", value = 0.47 },
  { source = "megatron_strong", name = "GPT-3 175B, 96 GPUs", model = gpt(12288, 96, 96),
    tp = 8, pp = 6, dp = 2, batch = 1152, metric = "mfu", value = 0.47, calibration = true },
  { source = "megatron_strong", name = "GPT-3 175B, 4608 GPUs", model = gpt(12288, 96, 96),
    tp = 8, pp = 6, dp = 96, batch = 1152, metric = "mfu", value = 0.42 },
  titan("Llama 3.1 8B, FSDP 8 (Table 1)", 8, 5762),
  titan("Llama 3.1 8B, FSDP 8 + torch.compile (Table 1)", 8, 6667, true),
  titan("Llama 3.1 8B, FSDP 128 (Table 3)", 128, 5605),
  titan("Llama 3.1 8B, FSDP 128 + torch.compile (Table 3)", 128, 6514, true),
}

M.sources = {
  megatron_weak = "NVIDIA/Megatron-LM README.md, Performance: images/model_table.png " ..
                  "(https://github.com/NVIDIA/Megatron-LM#performance-benchmarking)",
  megatron_strong = "NVIDIA/Megatron-LM README.md, strong scaling paragraph and " ..
                    "images/strong_scaling.png",
  torchtitan = "pytorch/torchtitan docs/performance.md, Llama 3.1 8B Tables 1 and 3 " ..
               "(https://github.com/pytorch/torchtitan/blob/main/docs/performance.md)",
}

-- What the published systems do that Tetra's engine does not (from their own
-- documentation, the same for every row of a source): Megatron-LM's README runs with
-- --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap and the distributed
-- optimizer reducing bf16 gradients; torchtitan's FSDP2 prefetches (overlaps) its
-- parameter all-gathers and reduce-scatters gradients in fp32 (MixedPrecisionPolicy's
-- reduce_dtype float32, its default).
-- fixed_buckets: their data-parallel buckets keep their size to the end of backward
-- (Tetra's shrink toward it, tetra.planner).
M.engines = {
  megatron_weak = { dp_bytes = 2, overlap_param_gather = true, overlap_tp = true,
                    fixed_buckets = true },
  megatron_strong = { dp_bytes = 2, overlap_param_gather = true, overlap_tp = true,
                      fixed_buckets = true },
  -- Eager PyTorch's scaled_dot_product_attention ran its flash backend, FlashAttention-2
  -- (the per-op checkpointing policy saves aten._scaled_dot_product_flash_attention;
  -- the cuDNN one joined that list only in December 2025), which reaches "only 35%
  -- utilization on the H100" (Shah et al. 2024, FlashAttention-3, arXiv:2407.08608,
  -- abstract) where the presets' 0.55 is FlashAttention-3 / cuDNN.
  -- Eager PyTorch runs every elementwise op as its own kernel (elementwise = "eager",
  -- counted op by op in tetra.planner); torch.compile fuses them (the planner's default).
  torchtitan = { dp_bytes = 4, overlap_param_gather = true, overlap_tp = true,
                 attention = 0.35, elementwise = "eager", fixed_buckets = true },
  torchtitan_compile = { dp_bytes = 4, overlap_param_gather = true, overlap_tp = true,
                         attention = 0.35, fixed_buckets = true },
}

-- The planner's prediction for row: the best layout with the row's sizes on `cluster`
-- (a preset name, default h100) that fits. Returns the record and the predicted value
-- of the row's metric.
function M.predict(row, cluster)
  local plan = require("tetra.planner")
  local W = row.tp * row.pp * row.dp
  local over = { nodes = W / 8 }
  for k, v in pairs(M.engines[row.engine or row.source] or {}) do over[k] = v end
  local cl = plan.cluster(cluster or row.cluster or "h100", over)
  local cfg = { model = row.model, train = { batch_size = row.batch, precision = "bf16" },
                parallel = {} }
  local best
  for _, lay in ipairs(plan.layouts(cfg, cl, { fixed = { tp = row.tp, pp = row.pp,
                                                        dp = row.dp, cp = 1 },
                                               recompute = row.recompute,
                                               max_micro_batch = 4 })) do
    local r = plan.evaluate(cfg, lay, cl)
    -- Not required to fit: Tetra keeps every forward op's output, more than these
    -- engines keep, so its accounting would put most of these layouts over 80 GB.
    local ok = not row.micro_batch or lay.micro_batch == row.micro_batch
    if ok and (not best or r.tokens_per_s > best.tokens_per_s) then best = r end
  end
  if not best then return nil end
  local v = row.metric == "mfu" and best.mfu or best.tokens_per_s_per_device
  return best, v
end

return M
