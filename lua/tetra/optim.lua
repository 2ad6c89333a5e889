-- tetra.optim: AdamW and SGD over fused C steps, gradient clipping, learning-rate schedules.
--
--   local opt = optim.AdamW(model:named_parameters(), { lr = 3e-4, weight_decay = 0.1 })
--   local norm = opt:clip_grad_norm(1.0)
--   opt:step(schedule(step))
--   opt:zero_grad()
--
-- Weight decay applies to parameters with two or more dims (matrices, embeddings) and not
-- to norm scales or biases, as in GPT-2 / nanoGPT / Llama training code.
-- The state is public: opt.params, opt.names, opt.m, opt.v, opt.step_count (checkpoints
-- and ZeRO-1 sharding read and replace it).
local ffi = require("ffi")
local C = require("tetra.ffi").C

local optim = {}

local function check(status)
  if status ~= 0 then error(ffi.string(C.tt_last_error()), 3) end
end

-- Accepts an array of tensors or of { name, tensor } pairs (Module:named_parameters()).
local function normalise(params)
  local names, tensors = {}, {}
  for i, p in ipairs(params) do
    if type(p) == "table" then
      names[i], tensors[i] = p[1], p[2]
    else
      names[i], tensors[i] = "param" .. (i - 1), p
    end
  end
  return names, tensors
end

local function carray(list)
  local arr = ffi.new("tt_tensor*[?]", math.max(#list, 1))
  for i, t in ipairs(list) do arr[i - 1] = t end
  return arr
end

local pout = require("tetra.tensor").pout
local take = require("tetra.tensor").take

-- f32 zeros shaped like t on t's device: the optimizer state lives beside its parameter.
-- (Also used by ZeRO-1 for the moments of its parameter shards.)
local function zeros_like(t)
  return take(C.tt_tensor_zeros(t._shape, t._ndim, C.TT_F32, t._device, pout), 3)
end
optim.state_like = zeros_like

-- The parameters as a C array, with their Lua references kept alive by the optimizer.
local function base(params)
  local names, tensors = normalise(params)
  return { names = names, params = tensors, c_params = carray(tensors), n = #tensors,
           step_count = 0 }
end

local function clip_grad_norm(self, max_norm)
  local norm = ffi.new("double[1]")
  if max_norm and max_norm > 0 then
    check(C.tt_clip_grad_norm(self.c_params, self.n, max_norm, norm))
  else
    check(C.tt_grad_norm(self.c_params, self.n, norm))
  end
  return norm[0]
end

local function zero_grad(self)
  for _, p in ipairs(self.params) do C.tt_zero_grad(p) end
end

-- -- AdamW -----------------------------------------------------------------------------

local AdamW = {}
AdamW.__index = AdamW
AdamW.clip_grad_norm = clip_grad_norm
AdamW.zero_grad = zero_grad

-- cfg: lr (1e-3), beta1 (0.9), beta2 (0.95), eps (1e-8), weight_decay (0.1).
function optim.AdamW(params, cfg)
  cfg = cfg or {}
  local self = setmetatable(base(params), AdamW)
  self.lr = cfg.lr or 1e-3
  self.beta1, self.beta2 = cfg.beta1 or 0.9, cfg.beta2 or 0.95
  self.eps = cfg.eps or 1e-8
  self.weight_decay = cfg.weight_decay or 0.1
  self.m, self.v = {}, {}
  for i, p in ipairs(self.params) do
    self.m[i], self.v[i] = zeros_like(p), zeros_like(p)
  end
  self:_build_groups()
  return self
end

-- Splits the parameters into a decayed (2-D and up) and an undecayed group of C arrays.
-- Call again after replacing params/m/v (ZeRO-1 keeps only its shards, shaped (1, k) for
-- matrices so that they stay in the decayed group).
function AdamW:_build_groups()
  local groups = { { wd = self.weight_decay, p = {}, m = {}, v = {} },
                   { wd = 0.0, p = {}, m = {}, v = {} } }
  for i, p in ipairs(self.params) do
    local g = p._ndim >= 2 and groups[1] or groups[2]
    g.p[#g.p + 1], g.m[#g.m + 1], g.v[#g.v + 1] = p, self.m[i], self.v[i]
  end
  self.groups = {}
  for _, g in ipairs(groups) do
    if #g.p > 0 then
      self.groups[#self.groups + 1] = { n = #g.p, wd = g.wd, c_p = carray(g.p),
        c_m = carray(g.m), c_v = carray(g.v), keep = g }
    end
  end
  self.c_params, self.n = carray(self.params), #self.params
  self._cfg = ffi.new("tt_adamw_config")
end

-- One update with learning rate lr (default: the constructor's).
function AdamW:step(lr)
  self.step_count = self.step_count + 1
  local cfg = self._cfg
  cfg.lr = lr or self.lr
  cfg.beta1, cfg.beta2, cfg.eps = self.beta1, self.beta2, self.eps
  for _, g in ipairs(self.groups) do
    cfg.weight_decay = g.wd
    check(C.tt_adamw_step(g.c_p, g.c_m, g.c_v, g.n, cfg, self.step_count))
  end
end

-- -- SGD -------------------------------------------------------------------------------

local SGD = {}
SGD.__index = SGD
SGD.clip_grad_norm = clip_grad_norm
SGD.zero_grad = zero_grad

-- cfg: lr (1e-2), momentum (0), weight_decay (0, applied to every parameter).
function optim.SGD(params, cfg)
  cfg = cfg or {}
  local self = setmetatable(base(params), SGD)
  self.lr = cfg.lr or 1e-2
  self.momentum = cfg.momentum or 0.0
  self.weight_decay = cfg.weight_decay or 0.0
  self.buffers = {}
  for i, p in ipairs(self.params) do self.buffers[i] = zeros_like(p) end
  self.c_buffers = carray(self.buffers)
  return self
end

function SGD:step(lr)
  self.step_count = self.step_count + 1
  check(C.tt_sgd_step(self.c_params, self.c_buffers, self.n, lr or self.lr, self.momentum,
                      self.weight_decay))
end

-- -- Schedules -------------------------------------------------------------------------

-- Returns lr(step) for 1-based optimizer steps. cfg: lr, warmup_steps (0), steps (total),
-- min_lr (0), schedule ("cosine", "linear" or "constant").
--   warmup:   lr * step / warmup_steps for step <= warmup_steps, then with progress p
--             going 0 -> 1 from the end of warmup to `steps`:
--   cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2
--   linear:   lr + (min_lr - lr) * p
--   constant: lr
local decays = {
  cosine = function(lr, min_lr, p) return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p)) end,
  linear = function(lr, min_lr, p) return lr + (min_lr - lr) * p end,
  constant = function(lr) return lr end,
}

function optim.schedule(cfg)
  local lr, warmup = cfg.lr, cfg.warmup_steps or 0
  local min_lr, total = cfg.min_lr or 0.0, cfg.steps
  local decay = decays[cfg.schedule or "cosine"]
  if not decay then
    error("optim.schedule: unknown schedule '" .. tostring(cfg.schedule) ..
          "' (expected cosine, linear or constant)", 2)
  end
  return function(step)
    if warmup > 0 and step <= warmup then return lr * step / warmup end
    if not total or total <= warmup then return lr end
    return decay(lr, min_lr, math.min(1.0, (step - warmup) / (total - warmup)))
  end
end

return optim
