-- Tetra side of tools/bench/train_vs_torch.sh (run as a recipe: `tetra run THIS_FILE`).
--
-- 1. Measures the sgemm peak: the best of several 1024^3 f32 matmuls through tt_matmul
--    (OpenBLAS), in GFLOP/s.
-- 2. Trains recipes/llama.lua's model on mock tokens with AdamW (2 warm-up steps, then
--    train.steps timed steps) and reports tokens/s of the median and of the best step,
--    and the share of the sgemm peak (the better of a measurement before and one after
--    training) that the best step achieves, counting the matmul FLOPs of a step:
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
  local peak = sgemm_peak_gflops(1024, 10)
  local env = llama.setup(cfg)
  local loss
  for _ = 1, 2 do env.step() end   -- warm-up: allocator cache, page faults
  local times = {}
  for i = 1, cfg.train.steps do
    local r = env.step()
    times[i], loss = r.step_time_s, r.loss
  end
  -- Measured again after training: the better of the two is the machine's peak.
  peak = math.max(peak, sgemm_peak_gflops(1024, 10))
  -- The median step is the typical speed; the best step is the speed without
  -- interference from other processes on a shared machine.
  table.sort(times)
  local median, best = times[math.floor(#times / 2) + 1], times[1]
  local flops = step_flops(cfg.model, cfg.train.batch_size)
  local tokens = cfg.train.batch_size * cfg.model.seq_len
  print(metrics.encode({
    impl = "tetra", threads = C.tt_get_num_threads(), steps = cfg.train.steps,
    step_time_s = median, tokens_per_s = tokens / median, best_step_time_s = best,
    best_tokens_per_s = tokens / best, last_loss = loss, step_gflop = flops / 1e9,
    achieved_gflops = flops / best / 1e9, sgemm_peak_gflops = peak,
    peak_fraction = flops / best / 1e9 / peak,
  }))
end

return recipe
