-- Tetra side of tools/bench/train_vs_torch.sh (run as a recipe: `tetra run THIS_FILE`).
--
-- TRAIN_VS_TORCH_MODEL picks the model (the shell script sets it):
--   llama  recipes/llama.lua: vocab 4096, dim 256, 4 layers, 4 heads, ffn 768, seq 256,
--          batch 8, untied head
--   gpt2   recipes/gpt2.lua at GPT-2 124M's shapes (vocab 50257, dim 768, 12 layers, 12
--          heads, ffn 3072, tied head), batch 4, seq 64 (so wpe has 64 rows)
-- Trains on mock tokens with AdamW (weight decay 0.1, betas 0.9/0.95, constant lr 3e-4,
-- gradient clipping at 1.0), train.precision as set (fp32 or bf16): `warmup` untimed steps
-- (allocator cache, page faults, bf16 weight copies), then train.steps timed steps.
-- Prints one JSON line: tokens/s of the median and of the best step, the parameter count.
local tetra = require("tetra")
local C = tetra.ffi.C
local metrics = tetra.metrics

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local which = os.getenv("TRAIN_VS_TORCH_MODEL") or "llama"
local warmup = tonumber(os.getenv("TRAIN_VS_TORCH_WARMUP") or "3")

local models = {
  llama = {
    file = "/../../recipes/llama.lua",
    model = { vocab_size = 4096, dim = 256, n_layers = 4, n_heads = 4, n_kv_heads = 4,
              ffn_hidden = 768, seq_len = 256, norm_eps = 1e-5, rope_theta = 10000.0,
              tie_embeddings = false, init_std = 0.02 },
    batch_size = 8,
  },
  gpt2 = {
    file = "/../../recipes/gpt2.lua",
    model = { vocab_size = 50257, dim = 768, n_layers = 12, n_heads = 12, n_kv_heads = 12,
              ffn_hidden = 3072, seq_len = 64, norm_eps = 1e-5, tie_embeddings = true,
              init_std = 0.02 },
    batch_size = 4,
  },
}
local spec = models[which]
if not spec then
  error("TRAIN_VS_TORCH_MODEL must be llama or gpt2, not " .. which)
end
local base = dofile(here .. spec.file)

local recipe = {
  name = "train_vs_torch",
  defaults = {
    model = spec.model,
    train = { steps = 10, batch_size = spec.batch_size, lr = 3e-4, lr_schedule = "constant",
              weight_decay = 0.1, max_grad_norm = 1.0, seed = 0, precision = "fp32" },
    optim = { name = "adamw", beta1 = 0.9, beta2 = 0.95, eps = 1e-8 },
    data = { mock = true },
    log = { progress = false },
  },
}

function recipe.run(cfg)
  local env = base.setup(cfg)
  local loss
  for _ = 1, warmup do env.step() end
  local times = {}
  for i = 1, cfg.train.steps do
    local r = env.step()
    times[i], loss = r.step_time_s, r.loss
  end
  -- The median step is the typical speed; the best step is the speed without
  -- interference from other processes on a shared machine.
  table.sort(times)
  local median, best = times[math.floor(#times / 2) + 1], times[1]
  local tokens = cfg.train.batch_size * cfg.model.seq_len
  print(metrics.encode({
    impl = "tetra", model = which, precision = cfg.train.precision,
    threads = C.tt_get_num_threads(), warmup = warmup, steps = cfg.train.steps,
    tokens_per_step = tokens, params = env.model:num_params(),
    step_time_s = median, tokens_per_s = tokens / median, best_step_time_s = best,
    best_tokens_per_s = tokens / best, last_loss = loss,
  }))
end

return recipe
