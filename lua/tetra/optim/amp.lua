-- tetra.amp: training precision (train.precision = fp32 | bf16 | fp16 | fp8).
--
-- It does precision only: the casts of the GEMMs, the fp16 loss scaler, the FP8 scaling
-- state. The optimizer step that uses them is tetra.train.step's (update, update_launch,
-- update_finish); a hand-written loop calls it the same way:
--   local ctx = amp.wrap(model, cfg)             -- the GEMMs of the model's Linear layers
--   per step:
--     F.backward(ctx:scale_loss(loss))           -- fp16: loss * scale; others: loss
--     local skipped, norm = step.update(ctx, opt.params,  -- fp16: grads / scale, inf/NaN
--       function() opt:step(lr) end,             -- run unless the grads were not finite
--       function() return opt:clip_grad_norm(max_norm) end,  -- clipping AFTER unscaling
--       dp_group)                                -- the verdict agreed over DP ranks
--     record.loss_scale, record.skipped = ctx:scale(), skipped
-- Around the optimizer's update, ctx:before_update and ctx:after_update mark the weights
-- written so that their cached bf16 / fp16 copies are cast again. Given the optimizer,
-- an AdamW that updates whole weights under bf16 writes each weight's bf16 copy in the
-- same pass (tt_adamw_multi), so no weight is cast between steps at all.
--
-- The parameters stay f32 in every mode (master weights, and the optimizer state beside
-- them). What changes is what the Linear layers compute with:
--   bf16 / fp16  x and W rounded to that dtype on the way in (tt_linear_lowp,
--                engine/tetra_amp.h). W's rounded copy is cached on the weight and cast
--                again only after the weight changed (the optimizer step, a load): once
--                per step, not once per GEMM. On CUDA tensors the GEMMs themselves run in
--                that dtype on the tensor cores with fp32 sums (tt_cuda_linear_lowp_cached,
--                engine/cuda/tetra_cuda_lowp.h); the rounded operands are kept for backward,
--                the output gradient is rounded too, and the f32 master weight gets an f32
--                gradient. On CPU the same arithmetic is emulated exactly around f32 GEMMs;
--   fp8          tt_fp8_linear: x and W in e4m3, the output gradient in e5m2, each with a
--                delayed per-tensor scale from an amax history; the GEMMs are cuBLASLt
--                FP8 GEMMs on CUDA (engine/cuda/fp8_linear.cu) and an emulation of their
--                arithmetic on the CPU (engine/ops/fp8.c): fp32 sums, bf16 Y and dX, f32 dW.
--                train.fp8_layers picks the layers; under data, context and tensor
--                parallelism the ranks agree their amaxes (opts.amax_group);
--                Under bf16 the activations between GEMMs are bf16 as well: the norms
--                write bf16, the GEMMs that read them write bf16 (RoPE, attention, SwiGLU,
--                GELU and the loss take it), and the layers whose output joins the
--                residual stream write f32 (half_gemm below). Under bf16 and fp16
--                the layers that read one x (q/k/v, w1 | w3) run as one GEMM through
--                tetra.nn.linears (group_gemm below);
--   fp16 also    a dynamic loss scaler: the loss is scaled up before backward, the grads
--                unscaled and checked before clipping and the optimizer, and a step with
--                inf/NaN grads skipped while the scale backs off.
-- GEMMs outside a Linear module (a language-model head that reuses a weight matrix) go
-- through amp.linear(model, x, w, b), which uses the context amp.wrap attached to the
-- model (model.amp) or a plain f32 linear.
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

-- state -> the tetra.dist group its amax_group points into (weak keys: the state's life).
local st_groups = setmetatable({}, { __mode = "k" })

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

-- loss * scale / (n_micro or 1), a new tensor (differentiable): one multiplication.
function Scaler:scale_loss(loss, n_micro)
  return take(C.tt_scale(loss, self.state.scale / (n_micro or 1), pout))
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

-- y = x W^T + b with x and W rounded to dtype (TT_BF16 / TT_F16): tensor-core GEMMs on
-- CUDA, the same arithmetic emulated around f32 GEMMs on the CPU (tt_linear_lowp). W is
-- read through its cached copy (tt_lowp_weight), cast once per change of the weight, not
-- once per GEMM. Gradients reach x, W and b in their own dtypes.
local function half_linear(x, w, bias, dtype)
  return take(C.tt_linear_lowp(x, w, bias, dtype, pout))
end

-- A Linear layer's GEMM under bf16 / fp16. Under bf16 the activations between GEMMs are
-- bf16 too: a layer given a bf16 x writes bf16 (its fp32 sums rounded once), except one
-- whose output is added into the residual stream (built with residual = true: attention's
-- output projection, the MLP's down projection), which writes f32, so the residual
-- stream, its adds and its norms' statistics stay f32 and so do the activations that
-- tensor and pipeline parallelism sum or send between blocks. An f32 x (fp16, or a layer
-- whose input no norm wrote) gives f32.
local function half_gemm(dtype, residual)
  local lowp_out = dtype == C.TT_BF16 and not residual
  return function(x, w, bias)
    local out = (lowp_out and x._dtype == dtype) and dtype or C.TT_F32
    return take(C.tt_linear_lowp_ex(x, w, bias, dtype, out, pout))
  end
end

-- The grouped GEMM of the Linear layers that read one x (tetra.nn.linears: fused QKV,
-- fused w1 | w3) under bf16 / fp16: one product with the weights' copies side by side,
-- each output a view of it; the output dtype follows x as in half_gemm. One function per
-- dtype, so layers given the same one can be grouped.
local group_gemms = {}
local function group_gemm(dtype)
  if group_gemms[dtype] then return group_gemms[dtype] end
  local outs = ffi.new("tt_tensor *[3]")
  local f = function(x, ws, bs)
    local n = #ws
    local wa = ffi.new("tt_tensor *[3]", ws)
    local ba = bs and ffi.new("tt_tensor *[3]", bs) or nil
    local out = (dtype == C.TT_BF16 and x._dtype == dtype) and dtype or C.TT_F32
    tffi.check(C.tt_linear_lowp_group(x, wa, ba, n, dtype, out, outs), 2)
    local r = {}
    for j = 1, n do
      r[j] = T.wrap(outs + (j - 1))
      outs[j - 1] = nil
    end
    return unpack(r, 1, n)
  end
  group_gemms[dtype] = f
  return f
end

-- Each layer owns its scaling state (three amax histories); the closure keeps it alive
-- for as long as the layer, which outlives every backward of its forwards. `group` (a
-- tetra.dist group or nil): the ranks over which every amax is agreed.
-- tt_fp8_linear writes Y in x's dtype (bf16 values either way); a layer whose output joins
-- the residual stream (residual = true) writes f32 from a bf16 x, as under bf16.
local function fp8_gemm(history, margin, group, fast_accum, residual)
  local st = ffi.gc(ffi.new("tt_fp8_linear_state"), C.tt_fp8_linear_state_release)
  tffi.check(C.tt_fp8_linear_state_init(st, history, margin), 3)
  st.fast_accum = fast_accum and 1 or 0
  if group and group.size > 1 then
    st.amax_group = group._c
    st_groups[st] = group   -- the communicator outlives the state
  end
  return function(x, w, bias)
    local y = take(C.tt_fp8_linear(x, w, bias, st, pout))
    if residual and y._dtype ~= C.TT_F32 then
      local y32 = take(C.tt_cast(y, C.TT_F32, pout))
      y:free()
      return y32
    end
    return y
  end, st
end

-- train.fp8_layers as a list of Lua patterns (nil for "all"). A glob's "*" matches any
-- run of characters; everything else is literal.
local function fp8_patterns(v)
  if v == nil or v == "all" then return nil end
  local globs = v
  if type(v) == "string" then
    globs = {}
    for g in v:gmatch("[^,]+") do globs[#globs + 1] = g:match("^%s*(.-)%s*$") end
  end
  local pats = {}
  for i, g in ipairs(globs) do
    pats[i] = { glob = g, pat = "^" .. g:gsub("[%^%$%(%)%%%.%[%]%+%-%?]", "%%%0")
                                        :gsub("%*", ".*") .. "$", used = false }
  end
  return pats
end

-- True when the Linear at `path` runs in FP8: by default every one not built with
-- fp8 = false (the head); with globs, exactly those whose path one matches.
local function fp8_selected(pats, path, m)
  if not pats then return m.fp8 ~= false end
  local hit = false
  for _, p in ipairs(pats) do
    if path:match(p.pat) then p.used, hit = true, true end
  end
  return hit
end

local Context = {}
Context.__index = Context

-- The scaler options from flat train.* keys (config.lua): loss_scale_init,
-- loss_scale_growth_factor, loss_scale_backoff, loss_scale_growth_interval; the C
-- defaults (torch.cuda.amp's) where unset.
local function scaler_options(t)
  return { init_scale = t.loss_scale_init, growth_factor = t.loss_scale_growth_factor,
           backoff_factor = t.loss_scale_backoff,
           growth_interval = t.loss_scale_growth_interval }
end

-- Gives each of model's Linear layers (every module with a `gemm`, tensor-parallel ones
-- included: tetra.parallel wraps forward around the gemm) the GEMM of
-- cfg.train.precision (or cfg.precision, or a string). Under fp8, train.fp8_layers picks
-- the layers ("all": every Linear not built with fp8 = false, i.e. all but a
-- language-model head; or module-path globs: exactly the Linears they match, a glob that
-- matches none being an error); the others keep f32. Then attaches the context to the
-- model (model.amp) and returns it. Wrapping a model again at the same precision returns
-- its context; at another precision is an error.
-- fp8 options: train.fp8_history (16), train.fp8_margin (0), train.fp8_layers ("all"),
-- train.fp8_fast_accum (false: cuBLASLt's fast accumulation in the forward GEMMs, CUDA only);
-- opts.amax_group (a tetra.dist group): every rank that runs these layers, on other
-- parts of the batch (data, context parallelism) or other parts of a layer (tensor
-- parallelism); every FP8 amax is agreed over it (all-reduce MAX), which gives each rank
-- the scales of one process on the whole batch; opts.partial:
-- this rank holds only some of the model's layers (pipeline stages), so a glob may
-- match none here; opts.fail(msg): how to report a bad train.fp8_layers (tetra.dist.fail:
-- one line, once). fp16: scaler_options.
function amp.wrap(model, cfg, opts)
  opts = opts or {}
  local t = type(cfg) == "table" and (cfg.train or cfg) or {}
  local precision = type(cfg) == "string" and cfg or t.precision or "fp32"
  if not PRECISIONS[precision] then
    error("train.precision: unknown value '" .. tostring(precision) ..
          "' (use fp32, bf16, fp16 or fp8)", 2)
  end
  local old = rawget(model, "amp")
  if old then
    if old.precision ~= precision then
      error("amp.wrap: the model is already wrapped for " .. old.precision ..
            ", cannot switch to " .. precision, 2)
    end
    return old
  end
  local ctx = setmetatable({ precision = precision, layers = 0, fp8_states = {},
                             skipped_steps = 0 }, Context)
  if precision == "fp16" then ctx.scaler = amp.scaler(scaler_options(t)) end
  ctx.model = model
  rawset(model, "amp", ctx)
  if precision == "fp32" then return ctx end
  local pats = precision == "fp8" and fp8_patterns(t.fp8_layers) or nil
  local linears = {}
  for _, nm in ipairs(model:named_modules()) do
    local path, m = nm[1], nm[2]
    -- bf16 activations start at the norms: each writes its output (a GEMM's operand) in
    -- bf16, read by the GEMM as it is. FP8 keeps them too (as Transformer Engine runs FP8
    -- GEMMs inside bf16 autocast): attention, RoPE and SwiGLU then run in bf16 (on CUDA,
    -- attention through cuDNN; in f32 the first H200 run's 1.1B Llama trained 15x slower
    -- in FP8 than in bf16, nearly all of it in the f32 attention kernel), and the Linear
    -- layers left out of FP8 (the head) widen their bf16 x to f32 GEMMs as before.
    if (precision == "bf16" or precision == "fp8") and m.add_forward then m.y_dtype = "bf16" end
    if m.gemm then
      linears[#linears + 1] = path
      if precision ~= "fp8" then
        local dtype = precision == "bf16" and C.TT_BF16 or C.TT_F16
        m.gemm = half_gemm(dtype, m.residual)
        if not m.residual then m.gemm_group = group_gemm(dtype) end
        ctx.layers = ctx.layers + 1
      elseif fp8_selected(pats, path, m) then
        local gemm, st = fp8_gemm(t.fp8_history or 16, t.fp8_margin or 0, opts.amax_group,
                                  t.fp8_fast_accum, m.residual)
        m.gemm = gemm
        ctx.fp8_states[path] = st
        ctx.layers = ctx.layers + 1
      else
        -- left out of FP8: an f32 GEMM, as before, of the bf16 x widened
        local plain = m.gemm
        m.gemm = function(x, w, b)
          if x._dtype == C.TT_F32 then return plain(x, w, b) end
          local x32 = x:float()
          local y = plain(x32, w, b)
          x32:free()
          return y
        end
      end
    end
  end
  for _, p in ipairs(pats or {}) do
    if not p.used and not opts.partial then
      local msg = string.format("config error: train.fp8_layers: '%s' matches no Linear " ..
                                "layer (they are: %s)", p.glob, table.concat(linears, ", "))
      if opts.fail then opts.fail(msg) end
      error(msg, 2)
    end
  end
  return ctx
end

-- The FP8 scaling state of every FP8 layer as plain tables, for a checkpoint:
-- { [layer path] = { x = meta, w = meta, g = meta } }, meta = { scale, pos, filled,
-- quantised, history = { amax ... } } (a device copy is fetched first).
function Context:fp8_state_dict()
  local out = {}
  for path, st in pairs(self.fp8_states) do
    tffi.check(C.tt_fp8_linear_state_sync(st, 0), 2)
    local e = {}
    for _, role in ipairs({ "x", "w", "g" }) do
      local m = st[role]
      local h = {}
      for i = 0, m.filled - 1 do h[i + 1] = tonumber(m.amax_history[i]) end
      e[role] = { scale = tonumber(m.scale), pos = m.pos, filled = m.filled, history = h,
                  quantised = m.quantised, history_len = m.history_len, margin = m.margin }
    end
    out[path] = e
  end
  return out
end

-- Restores fp8_state_dict's tables; `missing(path)` is called for an FP8 layer the
-- tables do not hold (it may raise). A table whose history length or margin differs from
-- the layer's (train.fp8_history / fp8_margin changed) is refused.
function Context:load_fp8_state_dict(d, missing)
  for path, st in pairs(self.fp8_states) do
    local e = d[path]
    if not e then
      missing(path)
    else
      for _, role in ipairs({ "x", "w", "g" }) do
        local m, r = st[role], e[role]
        if r.history_len ~= m.history_len or r.margin ~= m.margin then
          error(string.format("fp8 state of %s.%s: saved with history %s and margin %s, " ..
                              "this run has train.fp8_history=%d and train.fp8_margin=%d",
                              path, role, tostring(r.history_len), tostring(r.margin),
                              m.history_len, m.margin), 2)
        end
        ffi.fill(m.amax_history, ffi.sizeof(m.amax_history))
        for i, a in ipairs(r.history) do m.amax_history[i - 1] = a end
        m.scale, m.pos, m.filled = r.scale, r.pos, r.filled
        -- (a checkpoint from before the count: its layers quantised as often as they
        -- recorded an amax, as far as can be told)
        m.quantised = r.quantised or r.filled
      end
      tffi.check(C.tt_fp8_linear_state_sync(st, 1), 2)
    end
  end
end

-- x W^T + b at the context's precision, for GEMMs outside a Linear module (a language
-- model head that reuses the embedding matrix): bf16 / fp16 as the Linear layers compute
-- them; fp32 and fp8 a plain f32 tt_linear.
function Context:linear(x, w, bias)
  if self.precision == "bf16" then return half_linear(x, w, bias, C.TT_BF16) end
  if self.precision == "fp16" then return half_linear(x, w, bias, C.TT_F16) end
  return take(C.tt_linear(x, w, bias, pout))
end

-- x W^T + b through model's context (amp.wrap), or a plain f32 linear for a model that
-- was never wrapped: what a model's forward calls for a head outside a Linear module.
function amp.linear(model, x, w, bias)
  local ctx = rawget(model, "amp")
  if ctx then return ctx:linear(x, w, bias) end
  return take(C.tt_linear(x, w, bias, pout))
end

-- The seed of backward for one of n_micro micro-batch losses (n_micro: 1 when nil or
-- the loss is already divided): loss / n_micro x the fp16 loss scale. The one place a loss
-- is scaled: the plain and the pipelined step strategies (tetra.parallel.step, .pipeline)
-- both call it. Returns loss itself when there is nothing to multiply by. With the
-- stats' scale (use_stats_scale) the scale is read on the device, after the division.
function Context:scale_loss(loss, n_micro)
  n_micro = n_micro or 1
  local stats = self.scaler and self.scale_stats
  if not stats then
    if self.scaler then return self.scaler:scale_loss(loss, n_micro) end
    if n_micro == 1 then return loss end
    return take(C.tt_scale(loss, 1.0 / n_micro, pout))
  end
  local mean = loss
  if n_micro > 1 then mean = take(C.tt_scale(loss, 1.0 / n_micro, pout)) end
  -- mean x the stats' scale, read on the device (a view of the slot shaped like loss)
  local slot = take(C.tt_narrow(stats, 0, C.TT_STAT_LOSS_SCALE, 1, pout))
  local s = take(C.tt_view(slot, mean._shape, mean._ndim, pout))
  local out = take(C.tt_mul(mean, s, pout))
  s:free()
  slot:free()
  if mean ~= loss then mean:free() end
  return out
end

-- fp16 with an optimizer that keeps device stats (AdamW): the loss scale lives in
-- stats' TT_STAT_LOSS_SCALE / TT_STAT_INV_SCALE slots, which write_scale() fills before
-- each step (no wait), and scale_loss and the unscale read it there: a captured step
-- (train.cuda_graphs) then replays with each step's scale. Without a scaler: no effect.
function Context:use_stats_scale(stats)
  if self.scaler then self.scale_stats = stats end
end

-- The scaler's current scale into the stats (use_stats_scale); call before each step.
function Context:write_scale()
  if self.scale_stats then
    tffi.check(C.tt_step_stats_set_scale(self.scale_stats, self.scaler:scale()), 2)
  end
end

-- 1 without a scaler.
function Context:scale()
  return self.scaler and self.scaler:scale() or 1.0
end

-- fp16: divides the grads of params by the loss scale in place and returns true when one
-- held inf or NaN. With a DP `group` (a tetra.dist group; nil or size 1 for one process)
-- the flag is all-reduced (max) so that every rank reaches the same verdict, also when
-- each holds a different shard of the grads (ZeRO-1). Other precisions: false, no work
-- (their non-finite grads show in the gradient norm, which is the same on every rank).
-- With `opt` (an optimizer with device stats, tetra.optim.AdamW) found_inf stays on the
-- device, in opt's stats (agreed there over `group`), and nil is returned: the step's one
-- read of those stats brings it.
function Context:unscale(params, group, opt)
  if not self.scaler then return false end
  if opt and opt.unscale_into_stats then
    -- nil: the inverse scale the stats hold (use_stats_scale)
    opt:unscale_into_stats(params, not self.scale_stats and 1.0 / self.scaler:scale() or nil,
                           group)
    return nil
  end
  local found = self.scaler:unscale(params)
  if group and group.size > 1 then
    local flag = T.from_table({ found and 1 or 0 })
    group:all_reduce(flag, "max")
    found = C.tt_tensor_get(flag, 0) ~= 0
  end
  return found
end

-- A step skipped for a reason the scaler does not see (the loss guard's verdict on the
-- loss, before any unscaling): counted, the scale left as it is.
function Context:skip()
  self.skipped_steps = self.skipped_steps + 1
end

-- Ends a step: `found` true (inf/NaN grads) skips it and, with a scaler, backs the
-- scale off; a clean step may grow the scale. Returns true when the optimizer step must
-- be skipped.
function Context:update(found)
  local skip
  if self.scaler then skip = self.scaler:update(found) else skip = found and true or false end
  if skip then self:skip() end
  return skip
end

-- The weights whose bf16 copy an AdamW update writes in its own pass (tt_adamw_multi's
-- bf16 outputs into the copies' buffers), decided at the first step, when the forward
-- has made the copies: under bf16, for an optimizer that can (opt.set_bf16_copies) and
-- updates whole weights of this model (not ZeRO-1's shards). Others are cast again before
-- the next GEMM. Set ctx.optimizer_writes_copies = false to always cast.
local function written_copies(self, opt)
  if self._written ~= nil then return self._written end
  self._written = false
  if self.precision ~= "bf16" or not opt or not opt.set_bf16_copies
     or self.optimizer_writes_copies == false then
    return false
  end
  local mine = {}
  for _, p in ipairs(self.model:parameters()) do
    mine[T.key(p)] = true
  end
  local list, written = {}, {}
  for i, p in ipairs(opt.params) do
    if mine[T.key(p)] and p._lowp ~= nil
       and p._lowp._dtype == C.TT_BF16 then
      list[i] = take(C.tt_lowp_weight_buffer(p, C.TT_BF16, pout))
      written[#written + 1] = p
    end
  end
  if #written > 0 then
    opt:set_bf16_copies(list)
    self._written = written
  end
  return self._written
end

-- Call before the optimizer updates the weights (opt: the optimizer, when it can write
-- the bf16 copies itself); returns what after_update needs (nil: nothing to mark, f32
-- GEMMs cache no copy).
function Context:before_update(opt)
  if self.precision ~= "bf16" and self.precision ~= "fp16" then return nil end
  local params = self.model:parameters()
  local written = written_copies(self, opt)
  local before = {}
  for i, p in ipairs(params) do before[i] = C.tt_tensor_version(p) end
  return { params = params, before = before, written = written }
end

-- After the update: marks the model's weights written, so that their cached
-- low-precision copies are cast again before the next GEMM reads them, except where the
-- optimizer (AdamW) wrote the copy in the same pass: those are marked fresh. A weight
-- whose version already moved during the update was written by an optimizer that keeps
-- the count itself (and may have written the copy as well, tt_lowp_weight_mark_fresh):
-- it is left as the optimizer left it.
function Context:after_update(u)
  if not u then return end
  local before = u.before
  local fresh = {}
  for _, p in ipairs(u.written or {}) do
    C.tt_tensor_bump_version(p)
    tffi.check(C.tt_lowp_weight_mark_fresh(p), 2)
    fresh[T.key(p)] = true
  end
  for i, p in ipairs(u.params) do
    if not fresh[T.key(p)] and C.tt_tensor_version(p) == before[i] then
      C.tt_tensor_bump_version(p)
    end
  end
end

-- The weights that only the model's Linear layers read (their GEMMs, through the cached
-- copies above): each Linear's weight unless another module holds it too (an embedding
-- table tied to the head, which the lookup reads in f32). Optimizer offload keeps these
-- weights' f32 masters on the host (AdamW:masters_on_host).
function amp.gemm_only_weights(model)
  local linear, other = {}, {}
  for _, slot in ipairs(model:param_slots()) do
    local m, n, t = slot[1], slot[2], slot[3]
    local key = T.key(t)
    if m.gemm and n == "weight" then linear[key] = linear[key] or t
    else other[key] = true end
  end
  local list = {}
  for _, p in ipairs(model:parameters()) do
    local key = T.key(p)
    if linear[key] and not other[key] then list[#list + 1] = p end
  end
  return list
end

-- loss_scale (1 without a scaler) and steps skipped so far, for the metrics record.
function Context:metrics()
  return self:scale(), self.skipped_steps
end

return amp
