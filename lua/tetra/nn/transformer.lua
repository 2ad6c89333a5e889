-- Transformer pieces: Attention (grouped-query, optional RoPE), SwiGLU and GELU MLPs, and
-- the pre-norm residual TransformerBlock.
--
-- Activations keep the (B, T, H, Dh) layout end to end: the projections write (B, T, H*Dh),
-- which is viewed (free) as (B, T, H, Dh) for tt_rope and tt_attention and viewed back for
-- the output projection, so the forward never transposes or copies.
local F = require("tetra.nn.functional")
local Module = require("tetra.nn.module")
local layers = require("tetra.nn.layers")
local Linear, linears = layers.Linear, layers.linears

local M = {}

local free = F.free
local C = require("ffi").C

-- -- Attention -------------------------------------------------------------------------

local Attention = Module:extend("Attention")
M.Attention = Attention

-- cfg: dim, n_heads, n_kv_heads (default n_heads), head_dim (default dim / n_heads),
-- bias (default false), rope (default true), rope_theta (10000), rope_interleaved
-- (default false: rotate-half, as in Hugging Face Llama), std (0.02), out_std (std of the
-- residual output projection wo, default std).
function Attention:init(cfg)
  local n_heads = cfg.n_heads
  local n_kv = cfg.n_kv_heads or n_heads
  assert(n_heads % n_kv == 0, "Attention: n_heads must be a multiple of n_kv_heads")
  local hd = cfg.head_dim or math.floor(cfg.dim / n_heads)
  self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv, hd
  self.rope = cfg.rope ~= false
  self.rope_theta = cfg.rope_theta or 10000.0
  self.rope_interleaved = cfg.rope_interleaved or false
  local std = cfg.std or 0.02
  local lin = { bias = cfg.bias, std = std }
  self:add("wq", Linear(cfg.dim, n_heads * hd, lin))
  self:add("wk", Linear(cfg.dim, n_kv * hd, lin))
  self:add("wv", Linear(cfg.dim, n_kv * hd, lin))
  self:add("wo", Linear(n_heads * hd, cfg.dim, { bias = cfg.bias, std = cfg.out_std or std,
                                                  residual = true }))
end

-- A projection's output flat (B, T, n*Dh) viewed as heads: (B, T, n, Dh), n = its
-- features / Dh (so a projection whose output features are split over ranks yields this
-- rank's heads), rotated at `positions` when `rotate`: in place when the heads are
-- contiguous (the projection's own output, which nothing keeps for backward), else into
-- a copy (the strided views of a fused q/k/v GEMM). Consumes flat.
function Attention:heads(flat, rotate, positions)
  local n = tonumber(flat._shape[2]) / self.head_dim
  local h = F.reshape(flat, { tonumber(flat._shape[0]), tonumber(flat._shape[1]), n,
                              self.head_dim })
  free(flat)
  if not rotate then return h end
  local rope = C.tt_tensor_is_contiguous(h) ~= 0 and F.rope_ or F.rope
  local r = rope(h, self.rope_theta, positions, self.rope_interleaved)
  free(h)
  return r
end

-- Causal attention of q (B, T, H, Dh) over k, v (B, T, Hkv, Dh) at `positions` (T) or
-- 0..T-1 -> (B, T, H, Dh). Context parallelism replaces it per module.
function Attention:attend(q, k, v, positions)
  return F.causal_attention(q, k, v, positions)
end

-- x: (B, T, D); positions: (T) index tensor or nil for 0..T-1 -> (B, T, D)
function Attention:forward(x, positions)
  local fq, fk, fv = linears(x, { self.wq, self.wk, self.wv })       -- one GEMM under amp
  local q = self:heads(fq, self.rope, positions)
  local k = self:heads(fk, self.rope, positions)
  local v = self:heads(fv, false, positions)
  local o = self:attend(q, k, v, positions)                           -- (B, T, H, Dh)
  free(q); free(k); free(v)
  local flat = F.view(o, { tonumber(o._shape[0]), tonumber(o._shape[1]),
                           tonumber(o._shape[2]) * self.head_dim })
  free(o)
  local y = self.wo(flat)
  free(flat)
  return y
end

-- -- MLPs ------------------------------------------------------------------------------

-- Llama's feed-forward: w2(silu(w1 x) * w3 x).
local SwiGLU = Module:extend("SwiGLU")
M.SwiGLU = SwiGLU

-- cfg: dim, hidden, bias (false), std (0.02), out_std (std of w2, default std).
function SwiGLU:init(cfg)
  local std = cfg.std or 0.02
  self:add("w1", Linear(cfg.dim, cfg.hidden, { bias = cfg.bias, std = std }))
  self:add("w2", Linear(cfg.hidden, cfg.dim, { bias = cfg.bias, std = cfg.out_std or std,
                                               residual = true }))
  self:add("w3", Linear(cfg.dim, cfg.hidden, { bias = cfg.bias, std = std }))
end

-- x: (..., D) -> (..., D)
function SwiGLU:forward(x)
  local gate, up = linears(x, { self.w1, self.w3 })                 -- one GEMM under amp
  local h = F.swiglu(gate, up)
  free(gate); free(up)
  local y = self.w2(h)
  free(h)
  return y
end

-- GPT-2's feed-forward: c_proj(gelu_tanh(c_fc x)).
local GeluMLP = Module:extend("GeluMLP")
M.GeluMLP = GeluMLP

-- cfg: dim, hidden, bias (true), std (0.02), out_std (std of c_proj, default std).
function GeluMLP:init(cfg)
  local std = cfg.std or 0.02
  local bias = cfg.bias ~= false
  self:add("c_fc", Linear(cfg.dim, cfg.hidden, { bias = bias, std = std }))
  self:add("c_proj", Linear(cfg.hidden, cfg.dim, { bias = bias, std = cfg.out_std or std,
                                                   residual = true }))
end

function GeluMLP:forward(x)
  local h = self.c_fc(x)
  local a = F.gelu(h)
  free(h)
  local y = self.c_proj(a)
  free(a)
  return y
end

-- -- TransformerBlock ------------------------------------------------------------------

-- Pre-norm residual block: x = x + attn(norm1(x)); x = x + mlp(norm2(x)), the second
-- residual add fused with norm2 where the norm allows (fusable).
local TransformerBlock = Module:extend("TransformerBlock")
M.TransformerBlock = TransformerBlock

-- parts: { {name, norm1}, {name, attention}, {name, norm2}, {name, mlp} }; the names are
-- the parameter-name prefixes, e.g. Llama's attention_norm / attention / ffn_norm /
-- feed_forward or GPT-2's ln_1 / attn / ln_2 / mlp. The block finds its parts by name
-- on each call, so one replaced with add (a wider MLP, say) is the one that runs.
function TransformerBlock:init(parts)
  assert(#parts == 4, "TransformerBlock: expected {norm1, attention, norm2, mlp}")
  self._part_names = {}
  for i, p in ipairs(parts) do
    self:add(p[1], p[2])
    self._part_names[i] = p[1]
  end
end

-- Whether the residual add before a norm can run fused with it (add_forward, one pass
-- over memory): the norm has the method and runs its class's forward, not one a
-- parallel plan put in its place (sequence parallelism's, which needs the add apart).
local function fusable(norm)
  return norm.add_forward ~= nil and rawget(norm, "forward") == nil
end

-- x: (B, T, D); extra arguments go to the attention (positions). -> (B, T, D)
function TransformerBlock:forward(x, ...)
  local names = self._part_names
  local norm1, attn, norm2, mlp = self[names[1]], self[names[2]], self[names[3]], self[names[4]]
  local h = norm1(x)
  local a = attn(h, ...)
  free(h)
  local x1
  if fusable(norm2) then
    x1, h = norm2:add_forward(x, a)
  else
    x1 = F.add(x, a)
    h = norm2(x1)
  end
  free(a)
  local m = mlp(h)
  free(h)
  local y = F.add(x1, m)
  free(m); free(x1)
  return y
end

return M
