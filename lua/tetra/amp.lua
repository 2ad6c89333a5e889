-- tetra.amp: training precision (train.precision = fp32 | bf16 | fp16 | fp8).
--
--   local amp = tetra.amp
--   local ctx = amp.wrap(model, cfg)          -- rewires the model's Linear layers
--   ...
--   local loss = ctx:scale_loss(loss)          -- fp16: loss * scale; others: loss
--   F.backward(loss)
--   local skipped = ctx:step(params, function() optimizer:step() end)
--   record.loss_scale, record.skipped = ctx:metrics()
--
-- The parameters stay f32 in every mode (master weights, and the optimizer state beside
-- them). What changes is what the Linear layers compute with:
--   bf16 / fp16  x and W rounded to that dtype on the way in. On CUDA tensors the GEMMs
--                themselves run in that dtype on the tensor cores with fp32 sums
--                (tt_cuda_linear_lowp, engine/cuda/tetra_cuda_lowp.h): the op rounds its
--                operands once, keeps the rounded copies for backward and hands the f32
--                master weight an f32 gradient. On CPU the rounding is emulated with
--                tt_cast there and back (a differentiable pair) around an f32 GEMM;
--   fp8          tt_fp8_linear: x and W in e4m3, the output gradient in e5m2, each with a
--                delayed per-tensor scale from an amax history (engine/fp8.c);
--   fp16 also    a dynamic loss scaler: the loss is scaled up before backward, the grads
--                unscaled and checked before the optimizer, and a step with inf/NaN grads
--                skipped while the scale backs off.
-- On CPU these are exact emulations of the rounding; on CUDA the same code runs on the
-- device kernels.
local ffi = require("ffi")
local tffi = require("tetra.ffi")
tffi.cdef_header("tetra_amp.h")
local C = tffi.C
local T = require("tetra.tensor")

local pout, take = T.pout, T.take

local amp = {}

local PRECISIONS = { fp32 = true, bf16 = true, fp16 = true, fp8 = true }

-- -- Loss scaler ------------------------------------------------------------------------

local Scaler = {}
Scaler.__index = Scaler

-- Array of the n parameter tensors as `tt_tensor *[n]` (kept alive by `params`).
local function param_array(params)
  local n = #params
  local arr = ffi.new("tt_tensor *[?]", math.max(n, 1))
  for i = 1, n do arr[i - 1] = params[i] end
  return arr, n
end

-- cfg (all optional): init_scale, growth_factor, backoff_factor, growth_interval,
-- min_scale, max_scale; torch.cuda.amp's defaults otherwise.
function amp.scaler(cfg)
  cfg = cfg or {}
  local c = ffi.new("tt_loss_scaler_config")
  c.init_scale = cfg.init_scale or 0
  c.growth_factor = cfg.growth_factor or 0
  c.backoff_factor = cfg.backoff_factor or 0
  c.growth_interval = cfg.growth_interval or 0
  c.min_scale = cfg.min_scale or 0
  c.max_scale = cfg.max_scale or 0
  local s = ffi.new("tt_loss_scaler")
  tffi.check(C.tt_loss_scaler_init(s, c), 2)
  return setmetatable({ state = s }, Scaler)
end

function Scaler:scale() return tonumber(self.state.scale) end
function Scaler:skipped_steps() return tonumber(self.state.skipped_steps) end

-- loss * scale, a new tensor (differentiable).
function Scaler:scale_loss(loss)
  return take(C.tt_scale(loss, self.state.scale, pout))
end

-- Divides every grad of params by the scale in place; true when one held inf or NaN.
function Scaler:unscale(params)
  local arr, n = param_array(params)
  local found = ffi.new("int[1]")
  tffi.check(C.tt_loss_scaler_unscale(self.state, arr, n, found), 2)
  return found[0] ~= 0
end

-- Ends a step; true when the optimizer step must be skipped.
function Scaler:update(found_inf)
  return C.tt_loss_scaler_update(self.state, found_inf and 1 or 0) ~= 0
end

-- unscale, then optimizer_fn() unless the grads overflowed, then update the scale.
-- Returns true when the step was skipped.
function Scaler:step(params, optimizer_fn)
  local found = self:unscale(params)
  if not found then optimizer_fn() end
  return self:update(found)
end

-- Plain table for checkpoints, and back.
function Scaler:state_dict()
  local s = self.state
  return { scale = tonumber(s.scale), good_steps = tonumber(s.good_steps),
           skipped_steps = tonumber(s.skipped_steps), steps = tonumber(s.steps) }
end

function Scaler:load_state_dict(d)
  local s = self.state
  s.scale, s.good_steps = d.scale, d.good_steps
  s.skipped_steps, s.steps = d.skipped_steps or 0, d.steps or 0
end

-- -- Precision of Linear layers -------------------------------------------------------

local function cast(x, dtype) return take(C.tt_cast(x, dtype, pout)) end

-- x rounded to `dtype` and back to f32 (gradients pass through the same casts).
local function round_trip(x, dtype)
  local low = cast(x, dtype)
  local y = cast(low, C.TT_F32)
  ffi.gc(low, nil)
  C.tt_tensor_release(low)
  return y
end

-- True when the binary has the CUDA low-precision GEMMs (a CUDA build).
local has_lowp = nil
local function cuda_lowp()
  if has_lowp == nil then
    has_lowp = pcall(tffi.cdef_header, "cuda/tetra_cuda_lowp.h")
               and tffi.has_symbol("tt_cuda_linear_lowp") or false
  end
  return has_lowp
end

-- y = x W^T + b with x and W rounded to dtype (TT_BF16 / TT_F16): tensor-core GEMMs on
-- CUDA, the rounding emulated around an f32 GEMM on CPU. Gradients reach x, W and b in
-- their own dtypes.
local function half_linear(x, w, bias, dtype)
  if x._device ~= C.TT_CPU and cuda_lowp() then
    return take(C.tt_cuda_linear_lowp(x, w, bias, dtype, pout))
  end
  local xr, wr = round_trip(x, dtype), round_trip(w, dtype)
  local y = take(C.tt_linear(xr, wr, bias, pout))
  for _, t in ipairs({ xr, wr }) do ffi.gc(t, nil); C.tt_tensor_release(t) end
  return y
end

local function half_forward(dtype)
  return function(self, x) return half_linear(x, self.weight, self.bias, dtype) end
end

-- Each layer owns its scaling state (three amax histories); the closure keeps it alive
-- for as long as the layer, which outlives every backward of its forwards.
local function fp8_forward(history, margin)
  local st = ffi.new("tt_fp8_linear_state")
  tffi.check(C.tt_fp8_linear_state_init(st, history, margin), 3)
  return function(self, x)
    return take(C.tt_fp8_linear(x, self.weight, self.bias, st, pout))
  end, st
end

local Context = {}
Context.__index = Context

-- Rewires model's Linear layers for cfg.train.precision (or cfg.precision, or a string)
-- and returns the step context. fp8 options: train.fp8_history (16), train.fp8_margin (0).
-- fp16 scaler options: train.loss_scale = { init_scale = ..., growth_interval = ... }.
function amp.wrap(model, cfg)
  local t = type(cfg) == "table" and (cfg.train or cfg) or {}
  local precision = type(cfg) == "string" and cfg or t.precision or "fp32"
  if not PRECISIONS[precision] then
    error("train.precision: unknown value '" .. tostring(precision) ..
          "' (use fp32, bf16, fp16 or fp8)", 2)
  end
  local ctx = setmetatable({ precision = precision, layers = 0, fp8_states = {} }, Context)
  if precision == "fp16" then ctx.scaler = amp.scaler(t.loss_scale) end
  if precision == "fp32" then return ctx end
  for _, nm in ipairs(model:named_modules()) do
    local m = nm[2]
    if m.__name == "Linear" then
      if precision == "fp8" then
        local fwd, st = fp8_forward(t.fp8_history or 16, t.fp8_margin or 0)
        m.forward = fwd
        ctx.fp8_states[nm[1]] = st
      else
        m.forward = half_forward(precision == "bf16" and C.TT_BF16 or C.TT_F16)
      end
      ctx.layers = ctx.layers + 1
    end
  end
  return ctx
end

-- x W^T + b at the context's precision, for GEMMs outside a Linear module (a language
-- model head that reuses the embedding matrix): bf16 / fp16 as the Linear layers compute
-- them; fp32 and fp8 a plain f32 tt_linear.
function Context:linear(x, w, bias)
  if self.precision == "bf16" then return half_linear(x, w, bias, C.TT_BF16) end
  if self.precision == "fp16" then return half_linear(x, w, bias, C.TT_F16) end
  return take(C.tt_linear(x, w, bias, pout))
end

function Context:scale_loss(loss)
  if self.scaler then return self.scaler:scale_loss(loss) end
  return loss
end

-- Runs optimizer_fn unless the (fp16) scaler finds overflowed grads; true when skipped.
-- Without a scaler the grads are still checked: a non-finite gradient skips the step.
function Context:step(params, optimizer_fn)
  if self.scaler then return self.scaler:step(params, optimizer_fn) end
  local arr, n = param_array(params)
  local found = ffi.new("int[1]")
  tffi.check(C.tt_grads_unscale_check(arr, n, 1.0, found), 2)
  if found[0] ~= 0 then return true end
  optimizer_fn()
  return false
end

-- loss_scale (1 without a scaler) and skipped steps so far, for the metrics record.
function Context:metrics()
  if self.scaler then return self.scaler:scale(), self.scaler:skipped_steps() end
  return 1.0, 0
end

return amp
