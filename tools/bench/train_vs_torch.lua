-- Tetra side of tools/bench/train_vs_torch.sh (run as a recipe: `tetra run THIS_FILE`).
--
-- 1. Measures the sgemm peak: the best of several 1024^3 f32 matmuls through tt_matmul
--    (OpenBLAS), in GFLOP/s.
-- 2. Trains recipes/llama.lua's model on mock tokens with AdamW (2 warm-up steps, then
--    train.steps timed steps) and reports tokens/s and the share of the sgemm peak a step
--    achieves, counting the matmul FLOPs of a training step:
--      6 * N * tokens                       N = parameters of every linear layer + head
--    + 6 * n_layers * dim * seq_len * tokens  causal attention, QK^T and PV, fwd + bwd
-- Prints one JSON line.
local ffi = require("ffi")
local tetra = require("tetra")
local C = tetra.ffi.C
local F = tetra.nn.functional
local metrics = tetra.metrics

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local llama = dofile(here .. "/../../recipes/llama.lua")

local function sgemm_peak_gflops(n, reps)
  local a, b = F.randn({ n, n }), F.randn({ n, n })
  local out = ffi.new("tt_tensor*[1]")
  local best = math.huge
  for _ = 1, reps do
    local t0 = metrics.now()
    assert(C.tt_matmul(a, b, nil, 0, 0, out) == 0, ffi.string(C.tt_last_error()))
    best = math.min(best, metrics.now() - t0)
    C.tt_tensor_release(out[0])
  end
  return 2 * n * n * n / best / 1e9
end

local function step_flops(c, batch)
  local hd = c.dim / c.n_heads
  local per_layer = c.dim * c.n_heads * hd * 2 + c.dim * c.n_kv_heads * hd * 2 +
                    3 * c.dim * c.ffn_hidden
  local n = c.n_layers * per_layer + c.dim * c.vocab_size
  local tokens = batch * c.seq_len
  return 6 * n * tokens + 6 * c.n_layers * c.dim * c.seq_len * tokens
end

local recipe = {
  name = "train_vs_torch",
  defaults = {
    model = { vocab_size = 4096, dim = 256, n_layers = 4, n_heads = 4, n_kv_heads = 4,
              ffn_hidden = 768, seq_len = 256, norm_eps = 1e-5, rope_theta = 10000.0,
              tie_embeddings = false, init_std = 0.02 },
    train = { steps = 10, batch_size = 8, lr = 3e-4, lr_schedule = "constant",
              weight_decay = 0.1, max_grad_norm = 1.0, seed = 0 },
    optim = { name = "adamw", beta1 = 0.9, beta2 = 0.95, eps = 1e-8 },
    data = { mock = true },
    log = { progress = false },
  },
}

function recipe.run(cfg)
  local peak = sgemm_peak_gflops(1024, 8)
  local env = llama.setup(cfg)
  local warmup, steps = 2, cfg.train.steps
  local loss
  for _ = 1, warmup do env.step() end
  local t0 = metrics.now()
  for _ = 1, steps do loss = env.step().loss end
  local dt = (metrics.now() - t0) / steps
  local flops = step_flops(cfg.model, cfg.train.batch_size)
  local achieved = flops / dt / 1e9
  print(metrics.encode({
    impl = "tetra", threads = C.tt_get_num_threads(), steps = steps, step_time_s = dt,
    tokens_per_s = cfg.train.batch_size * cfg.model.seq_len / dt, last_loss = loss,
    step_gflop = flops / 1e9, achieved_gflops = achieved, sgemm_peak_gflops = peak,
    peak_fraction = achieved / peak,
  }))
end

return recipe
