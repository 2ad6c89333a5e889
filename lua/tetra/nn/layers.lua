-- Basic layers: Linear, Embedding, RMSNorm, LayerNorm, ModuleList.
--
-- Initialisation follows GPT-2 / Llama practice: weights ~ Normal(0, std) with std 0.02 by
-- default (callers pass a smaller std for residual projections), biases 0, norm scales 1.
local F = require("tetra.nn.functional")
local C = require("tetra.ffi").C
local Module = require("tetra.nn.module")

local M = {}

-- -- Linear: y = x W^T + b, W: (out, in) -------------------------------------------

local Linear = Module:extend("Linear")
M.Linear = Linear

-- opts: bias (default false), std (default 0.02), weight (an existing (out, in) parameter
-- to share instead of drawing one: a language-model head tied to the embedding), fp8
-- (default true; false keeps this layer out of FP8 under train.precision=fp8), residual
-- (default false; true: the output is added into a residual stream, so under bf16 it is
-- written in f32, tetra.amp).
function Linear:init(in_features, out_features, opts)
  opts = opts or {}
  self.in_features, self.out_features = in_features, out_features
  self:param("weight", opts.weight or
                       F.parameter(F.randn({ out_features, in_features }, opts.std or 0.02)))
  if opts.bias then
    self:param("bias", F.parameter(F.zeros({ out_features })))
  end
  if opts.fp8 == false then self.fp8 = false end
  if opts.residual then self.residual = true end
end

-- The GEMM y = x W^T + b every Linear runs: tetra.amp replaces it per layer with one at
-- the training precision; tetra.parallel wraps forward around it, never replaces it.
Linear.gemm = F.linear

-- x: (..., in) -> (..., out)
function Linear:forward(x)
  return self.gemm(x, self.weight, self.bias)
end

-- Several Linear layers on the same x (attention's q, k and v projections; the gate and
-- up projections of a SwiGLU MLP) -> their outputs, in order. One GEMM when tetra.amp
-- gave every layer the same grouped GEMM (bf16 / fp16: tt_linear_lowp_group, the
-- outputs strided views of one result) and either none has a forward of its own or all
-- have one that only transforms x before that GEMM, the same for all (group_input: a
-- column-parallel wrapper's gather, which then runs once). Without a grouped GEMM, on
-- an f32 x (fp32) layers that all have that transform still share it: it runs once, then
-- each layer's GEMM (one gather and, in backward, one reduction of x's gradient, where
-- each layer's own forward made one each). (fp8's x is bf16: its gradient's three parts
-- would be rounded in another order than one process rounds them, and the greedy sample
-- of tests/dist/generate.sh after 30 steps changed a token.) Otherwise each layer's own
-- forward.
function M.linears(x, layers)
  local group, input = layers[1].gemm_group, layers[1].group_input
  local with_bias = layers[1].bias ~= nil
  local shared = input ~= nil and x._dtype == C.TT_F32
  for _, m in ipairs(layers) do
    local own = rawget(m, "forward") ~= nil
    if m.gemm_group ~= group or (m.bias ~= nil) ~= with_bias or m.group_input ~= input or
       own ~= (input ~= nil) then
      group = nil
    end
    if m.group_input ~= input or not own then shared = false end
  end
  if group then
    local ws, bs = {}, with_bias and {} or nil
    for i, m in ipairs(layers) do
      ws[i] = m.weight
      if bs then bs[i] = m.bias end
    end
    local xi = input and input(x) or x
    local outs = { group(xi, ws, bs) }
    if xi ~= x then F.free(xi) end
    return unpack(outs)
  end
  local outs = {}
  if shared then
    local xi = input(x)
    for i, m in ipairs(layers) do outs[i] = m.gemm(xi, m.weight, m.bias) end
    if xi ~= x then F.free(xi) end
    return unpack(outs)
  end
  for i, m in ipairs(layers) do outs[i] = m(x) end
  return unpack(outs)
end

-- -- Embedding: a lookup table (V, D) -------------------------------------------------

local Embedding = Module:extend("Embedding")
M.Embedding = Embedding

function Embedding:init(num_embeddings, dim, opts)
  opts = opts or {}
  self.num_embeddings, self.dim = num_embeddings, dim
  self:param("weight", F.parameter(F.randn({ num_embeddings, dim }, opts.std or 0.02)))
end

-- ids: (...) i32/i64 -> (..., D)
function Embedding:forward(ids)
  return F.embedding(self.weight, ids)
end

-- -- RMSNorm: x / sqrt(mean(x^2) + eps) * weight --------------------------------------

local RMSNorm = Module:extend("RMSNorm")
M.RMSNorm = RMSNorm

function RMSNorm:init(dim, eps)
  self.eps = eps or 1e-5
  self:param("weight", F.parameter(F.full({ dim }, 1.0)))
end

-- A norm's output dtype is x's, or self.y_dtype when set (tetra.amp sets "bf16" under
-- bf16: the output is the next GEMM's operand).
function RMSNorm:forward(x)
  if not self.y_dtype then return F.rmsnorm(x, self.weight, self.eps) end
  local h, y = F.add_rms_norm(x, nil, self.weight, self.eps, self.y_dtype)
  F.free(h)
  return y
end

-- The residual add before the norm, fused with it (one pass over memory): returns
-- h = x + residual and the norm of h.
function RMSNorm:add_forward(x, residual)
  return F.add_rms_norm(x, residual, self.weight, self.eps, self.y_dtype)
end

-- -- LayerNorm: (x - mean) / sqrt(var + eps) * weight + bias --------------------------

local LayerNorm = Module:extend("LayerNorm")
M.LayerNorm = LayerNorm

-- opts: bias (default true).
function LayerNorm:init(dim, eps, opts)
  self.eps = eps or 1e-5
  self:param("weight", F.parameter(F.full({ dim }, 1.0)))
  if not opts or opts.bias ~= false then
    self:param("bias", F.parameter(F.zeros({ dim })))
  end
end

function LayerNorm:forward(x)
  if not self.y_dtype then return F.layernorm(x, self.weight, self.bias, self.eps) end
  local h, y = F.add_layer_norm(x, nil, self.weight, self.bias, self.eps, self.y_dtype)
  F.free(h)
  return y
end

-- As RMSNorm:add_forward: h = x + residual and the norm of h, in one pass.
function LayerNorm:add_forward(x, residual)
  return F.add_layer_norm(x, residual, self.weight, self.bias, self.eps, self.y_dtype)
end

-- -- ModuleList: an ordered container; children are named "0", "1", ... --------------

local ModuleList = Module:extend("ModuleList")
M.ModuleList = ModuleList

-- modules: optional array. The list is also a Lua array: #list, list[i], ipairs(list).
function ModuleList:init(modules)
  for _, m in ipairs(modules or {}) do self:append(m) end
end

function ModuleList:append(module)
  local i = #self + 1
  self[i] = module
  self:add(tostring(i - 1), module)
  return module
end

-- Runs the modules in sequence, h = m(h, ...), freeing each intermediate once the next
-- module has consumed it (the caller keeps x).
function ModuleList:forward(x, ...)
  local h = x
  for i = 1, #self do
    local y = self[i](h, ...)
    if h ~= x and h ~= y then F.free(h) end
    h = y
  end
  return h
end

return M
