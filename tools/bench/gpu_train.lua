-- tools/bench/gpu_train.lua — the Llama recipe's model trained on one device (cpu or one
-- GPU) at a given train.precision, with its own short loop: the GPU end-to-end test
-- (tests/cuda/gpu_bf16.sh: the bf16 GPU loss curve against the fp32 CPU one) and the
-- tokens/s figure of tools/gpu-check come from here.
--
--   tetra run tools/bench/gpu_train.lua --set train.device=cuda --set train.precision=bf16 \
--     --set log.metrics_file=gpu.jsonl
--
-- The weights are initialised on the CPU from train.seed (so every device starts from the
-- same values), then moved. Data: train.data_source (mock tokens, or a text file with
-- data.input_path), batches drawn from (seed, step): the same on every device. Each step: forward, mean cross-entropy, backward, clip to max_grad_norm, AdamW
-- (fp32 master weights and state on the device) with the recipe's schedule. One JSON
-- line per step in log.metrics_file: step, loss, lr, grad_norm, tokens, tokens_per_s,
-- step_time_s. The last line printed: "gpu_train: ... tokens_per_s=N" over the steps after
-- train.timed_from (the first ones pay for allocation and cuBLASLt's heuristics).
local ffi = require("ffi")
local tetra = require("tetra")
local tffi = require("tetra.ffi")
local C = tffi.C
local F = require("tetra.nn.functional")
local train, optim = tetra.train, tetra.optim

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local llama = dofile(here .. "/../../recipes/llama.lua")

local recipe = {
  name = "gpu_train",
  defaults = {
    model = { vocab_size = 256, dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2,
              ffn_hidden = 128, seq_len = 32, norm_eps = 1e-5, rope_theta = 10000.0,
              tie_embeddings = false, init_std = 0.02 },
    train = { steps = 20, batch_size = 8, lr = 3e-3, min_lr = 3e-4, warmup_steps = 2,
              lr_schedule = "cosine", weight_decay = 0.1, max_grad_norm = 1.0, seed = 0,
              device = "cpu", timed_from = 3 },
    optim = { name = "adamw", beta1 = 0.9, beta2 = 0.95, eps = 1e-8 },
    data = { mock = true },
  },
}

local function now()
  local tv = ffi.new("struct { int64_t s, us; }")
  ffi.C.gettimeofday(tv, nil)
  return tonumber(tv.s) + tonumber(tv.us) * 1e-6
end
ffi.cdef("int gettimeofday(void *tv, void *tz);")

-- Replaces every parameter of model by a copy on `dev` that requires grad. A tensor
-- shared by two modules (tied embeddings) becomes one shared copy.
local function move_params(model, dev)
  local moved = {}
  for _, nm in ipairs(model:named_modules()) do
    local m = nm[2]
    for _, name in ipairs(m._param_names) do
      local p = m[name]
      if p ~= nil then
        local key = tostring(ffi.cast("uintptr_t", ffi.cast("void *", p)))
        if not moved[key] then
          local d = p:to(dev)
          tffi.check(C.tt_set_requires_grad(d, 1))
          moved[key] = d
        end
        m[name] = moved[key]
      end
    end
  end
end

-- AdamW's state on the parameters' device (optim.AdamW creates it on the CPU).
local function state_on_device(opt, dev)
  for i, p in ipairs(opt.params) do
    if opt.m[i]._device ~= p._device then
      opt.m[i], opt.v[i] = opt.m[i]:to(dev), opt.v[i]:to(dev)
    end
  end
  opt:_build_groups()
end

function recipe.run(cfg)
  local t = cfg.train
  local dev = t.device
  local on_gpu = dev ~= "cpu"
  if on_gpu then
    tffi.cdef_header("tetra_cuda.h")
    if not tffi.has_symbol("tt_cuda_init") then error("gpu_train: this tetra has no CUDA", 0) end
    tffi.check(C.tt_cuda_init())
  end
  tetra.manual_seed(t.seed)
  local model = llama.Model(cfg.model)
  if on_gpu then move_params(model, dev) end
  local ctx = tetra.amp.wrap(model, cfg)
  local head_linear = function(x, w) return ctx:linear(x, w, nil) end
  -- The head reuses the embedding (tied) or its own Linear's weight through F.linear;
  -- route it through the context so it runs at the training precision too.
  model.forward = function(self, ids)
    local x = self.tok_embeddings(ids)
    local h = self.layers(x)
    F.free(x)
    local n = self.norm(h)
    F.free(h)
    local logits = head_linear(n, self.output and self.output.weight or self.tok_embeddings.weight)
    F.free(n)
    return logits
  end
  local params = model:named_parameters()
  local opt = optim.AdamW(params, { lr = t.lr, beta1 = cfg.optim.beta1, beta2 = cfg.optim.beta2,
                                    eps = cfg.optim.eps, weight_decay = t.weight_decay })
  if on_gpu then state_on_device(opt, dev) end
  local schedule = optim.schedule({ lr = t.lr, min_lr = t.min_lr, warmup_steps = t.warmup_steps,
                                    steps = t.steps, schedule = t.lr_schedule })
  local data = train.data_source(cfg)
  local out = cfg.log and cfg.log.metrics_file
  local f = out and out ~= "" and assert(io.open(out, "w")) or nil
  local tokens_per_step = t.batch_size * cfg.model.seq_len
  print(string.format("gpu_train: %.2fM parameters on %s, precision %s, %d tokens/step",
                      model:num_params() / 1e6, dev, ctx.precision, tokens_per_step))
  local timed_t, timed_steps = 0.0, 0
  for step = 1, t.steps do
    local t0 = now()
    local tokens = data:batch(step, t.batch_size, cfg.model.seq_len, "train")
    if on_gpu then tokens = tokens:to(dev) end
    local loss = train.loss(model, tokens)
    local loss_value = loss:item()
    loss:backward()
    local norm = opt:clip_grad_norm(t.max_grad_norm)
    local lr = schedule(step)
    ctx:step(opt.params, function() opt:step(lr) end)
    opt:zero_grad()
    if on_gpu then tffi.check(C.tt_cuda_synchronize()) end
    local dt = now() - t0
    if step >= t.timed_from then timed_t, timed_steps = timed_t + dt, timed_steps + 1 end
    if f then
      f:write(string.format('{"step": %d, "loss": %.9g, "lr": %.9g, "grad_norm": %.9g, ' ..
        '"tokens": %d, "tokens_per_s": %.6g, "step_time_s": %.6g}\n', step, loss_value, lr,
        norm, step * tokens_per_step, tokens_per_step / dt, dt))
      f:flush()
    end
    F.free(tokens)
    F.free(loss)
  end
  if f then f:close() end
  local tps = timed_steps > 0 and tokens_per_step * timed_steps / timed_t or 0
  print(string.format("gpu_train: %d steps, %s, %s: tokens_per_s=%.1f", t.steps, dev,
                      ctx.precision, tps))
end

return recipe
