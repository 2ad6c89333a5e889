-- tetra.parallel.tensor: Megatron-style tensor parallelism over the mesh's tp group.
--
--   local tp = tetra.parallel.tensor
--   tp.ColumnParallelLinear(in, out, { group = mesh.tp, std = 0.02 })  -- W rows split
--   tp.RowParallelLinear(in, out, { group = mesh.tp, std = 0.02 })     -- W columns split
--   tp.VocabParallelEmbedding(V, D, { group = mesh.tp, std = 0.02 })   -- table rows split
--   tp.Attention{ ..., group = mesh.tp }   tp.SwiGLU{ ..., group = mesh.tp }
--   tp.vocab_parallel_cross_entropy(logits, targets, group, vocab_start)
--   tp.attach_optimizer(opt, model, group)  -- clip_grad_norm over the whole model
--
-- Column-parallel: the input goes through copy_to_group (identity forward; backward
-- all-reduces the input gradient, since every rank used the same x), each rank computes
-- its slice of the outputs, which stay split. Row-parallel: the input arrives split on
-- its last dim (a column-parallel output), each rank multiplies by its columns of W and
-- the partial products are summed by reduce_from_group (all-reduce forward, identity
-- backward). Attention splits heads (q, k, v column-parallel with n_heads / tp and
-- n_kv_heads / tp heads per rank, o row-parallel); SwiGLU splits the hidden units (w1, w3
-- column, w2 row); norms are replicated.
--
-- Initialisation: every layer draws the full weight from the engine's RNG in the order
-- the single-process layer would, then keeps its slice, so for a given seed the ranks
-- hold exactly the slices of the single-process model and the loss curve matches it.
-- Parameters keep their single-process names; a module lists its sharded parameters in
-- module._tp_sharded (the rest are replicated over the group).
local ffi = require("ffi")
local tffi = require("tetra.ffi")
tffi.cdef_header("tetra_vocab_parallel.h")
local T = require("tetra.tensor")
local F = require("tetra.nn.functional")
local Module = require("tetra.nn.module")
local transformer = require("tetra.nn.transformer")

local C = ffi.C
local free = F.free
local M = {}

-- A user error raised once (by rank 0) when every rank hits it alike.
local function fail(fmt, ...)
  require("tetra.dist").fail(string.format(fmt, ...))
end

local function divisible(what, n, group)
  if n % group.size ~= 0 then
    fail("tensor parallelism: %s (%d) must be divisible by parallel.tensor_parallel_size (%d)",
         what, n, group.size)
  end
  return n / group.size
end

-- Rows [rank * n / size, (rank + 1) * n / size) of `full` along `dim` as a new leaf
-- parameter; frees full.
local function shard_param(full, dim, group)
  local n = full:size(dim)
  local len = n / group.size
  local v = F.narrow(full, dim, group.rank * len, len)
  local p = F.contiguous(v)
  free(v); free(full)
  return F.parameter(p)
end

-- -- Linear layers -------------------------------------------------------------------

local ColumnParallelLinear = Module:extend("ColumnParallelLinear")
M.ColumnParallelLinear = ColumnParallelLinear

-- y = x W^T (+ b), W: (out, in) with this rank's out / tp rows (and bias entries).
-- opts: group (required), std (0.02), bias (false).
function ColumnParallelLinear:init(in_features, out_features, opts)
  local g = assert(opts and opts.group, "ColumnParallelLinear: opts.group is required")
  self.group = g
  self.in_features, self.out_features = in_features, out_features
  self.local_out = divisible("the output features of a column-parallel layer",
                             out_features, g)
  self.out_start = g.rank * self.local_out
  self:param("weight", shard_param(F.randn({ out_features, in_features }, opts.std or 0.02),
                                   0, g))
  self._tp_sharded = { weight = true }
  if opts.bias then
    self:param("bias", F.parameter(F.zeros({ self.local_out })))
    self._tp_sharded.bias = true
  end
end

-- x: (..., in) replicated -> (..., out / tp), this rank's output columns.
function ColumnParallelLinear:forward(x)
  local xc = self.group:copy_to_group(x)
  local y = F.linear(xc, self.weight, self.bias)
  free(xc)
  return y
end

local RowParallelLinear = Module:extend("RowParallelLinear")
M.RowParallelLinear = RowParallelLinear

-- y = x W^T (+ b), W: (out, in) with this rank's in / tp columns; the bias is replicated
-- and added once, after the sum. opts: group (required), std (0.02), bias (false).
function RowParallelLinear:init(in_features, out_features, opts)
  local g = assert(opts and opts.group, "RowParallelLinear: opts.group is required")
  self.group = g
  self.in_features, self.out_features = in_features, out_features
  self.local_in = divisible("the input features of a row-parallel layer", in_features, g)
  self:param("weight", shard_param(F.randn({ out_features, in_features }, opts.std or 0.02),
                                   1, g))
  self._tp_sharded = { weight = true }
  if opts.bias then self:param("bias", F.parameter(F.zeros({ out_features }))) end
end

-- x: (..., in / tp) split -> (..., out) replicated.
function RowParallelLinear:forward(x)
  local part = F.linear(x, self.weight, nil)
  local y = self.group:reduce_from_group(part)
  free(part)
  if self.bias == nil then return y end
  local yb = F.add(y, self.bias)
  free(y)
  return yb
end

-- -- Embedding -----------------------------------------------------------------------

local VocabParallelEmbedding = Module:extend("VocabParallelEmbedding")
M.VocabParallelEmbedding = VocabParallelEmbedding

-- A (V, D) table with this rank's rows [vocab_start, vocab_start + V / tp).
-- opts: group (required), std (0.02).
function VocabParallelEmbedding:init(num_embeddings, dim, opts)
  local g = assert(opts and opts.group, "VocabParallelEmbedding: opts.group is required")
  self.group = g
  self.num_embeddings, self.dim = num_embeddings, dim
  self.local_rows = divisible("model.vocab_size", num_embeddings, g)
  self.vocab_start = g.rank * self.local_rows
  self:param("weight", shard_param(F.randn({ num_embeddings, dim }, opts.std or 0.02), 0, g))
  self._tp_sharded = { weight = true }
end

-- Local ids (ids - vocab_start, 0 where this rank does not own the id) and a (..., 1)
-- mask that is 1 where it does. ids: contiguous CPU i32/i64 (no grad).
local function local_ids(ids, start, rows)
  local n = ids:numel()
  local shape = ids:shape()
  local lid = F.empty(shape, C.TT_I64)
  local mshape = {}
  for i, s in ipairs(shape) do mshape[i] = s end
  mshape[#mshape + 1] = 1
  local mask = F.empty(mshape, C.TT_F32)
  local src = C.tt_tensor_data(ids)
  local i64 = ids._dtype == C.TT_I64
  local s64, s32 = ffi.cast("int64_t *", src), ffi.cast("int32_t *", src)
  local dst = ffi.cast("int64_t *", C.tt_tensor_data(lid))
  local m = ffi.cast("float *", C.tt_tensor_data(mask))
  for i = 0, n - 1 do
    local id = i64 and s64[i] or s32[i]
    local l = id - start
    if l >= 0 and l < rows then
      dst[i], m[i] = l, 1.0
    else
      dst[i], m[i] = 0, 0.0
    end
  end
  return lid, mask
end

-- ids: (...) i32/i64 on the CPU, replicated -> (..., D) replicated. Ids outside this
-- rank's rows contribute 0 (and no gradient); the all-reduce adds the owner's row.
function VocabParallelEmbedding:forward(ids)
  local idc = F.contiguous(ids)
  local lid, mask = local_ids(idc, self.vocab_start, self.local_rows)
  if idc ~= ids then free(idc) end
  local e = F.embedding(self.weight, lid)
  local masked = F.mul(e, mask)
  free(e); free(lid); free(mask)
  local y = self.group:reduce_from_group(masked)
  free(masked)
  return y
end

-- -- Loss ----------------------------------------------------------------------------

-- logits: (..., V / tp) this rank's vocabulary columns starting at vocab_start; targets:
-- (...) global ids -> the scalar mean cross-entropy of the full logits (every rank).
function M.vocab_parallel_cross_entropy(logits, targets, group, vocab_start, ignore_index)
  return T.take(C.tt_vocab_parallel_cross_entropy(group._c, logits, targets, vocab_start,
                                                  ignore_index or -100, T.pout), 2)
end

-- -- Transformer pieces ----------------------------------------------------------------

local Attention = transformer.Attention:extend("TensorParallelAttention")
M.Attention = Attention

-- cfg: as nn.Attention's, plus group. q, k, v are column-parallel (this rank's n_heads /
-- tp query heads and n_kv_heads / tp key/value heads: the query heads of a rank use only
-- that rank's key/value heads), wo row-parallel. Weights drawn in nn.Attention's order.
function Attention:init(cfg)
  local g = assert(cfg.group, "tensor-parallel Attention: cfg.group is required")
  local n_heads = cfg.n_heads
  local n_kv = cfg.n_kv_heads or n_heads
  assert(n_heads % n_kv == 0, "Attention: n_heads must be a multiple of n_kv_heads")
  local hd = cfg.head_dim or math.floor(cfg.dim / n_heads)
  self.n_heads = divisible("model.n_heads", n_heads, g)
  self.n_kv_heads = divisible("model.n_kv_heads", n_kv, g)
  self.head_dim = hd
  self.rope = cfg.rope ~= false
  self.rope_theta = cfg.rope_theta or 10000.0
  self.rope_interleaved = cfg.rope_interleaved or false
  local std = cfg.std or 0.02
  local lin = { bias = cfg.bias, std = std, group = g }
  self:add("wq", ColumnParallelLinear(cfg.dim, n_heads * hd, lin))
  self:add("wk", ColumnParallelLinear(cfg.dim, n_kv * hd, lin))
  self:add("wv", ColumnParallelLinear(cfg.dim, n_kv * hd, lin))
  self:add("wo", RowParallelLinear(n_heads * hd, cfg.dim,
                                   { bias = cfg.bias, std = cfg.out_std or std, group = g }))
end

local SwiGLU = transformer.SwiGLU:extend("TensorParallelSwiGLU")
M.SwiGLU = SwiGLU

-- cfg: as nn.SwiGLU's, plus group. w1, w3 column-parallel, w2 row-parallel (hidden / tp
-- units per rank); weights drawn in nn.SwiGLU's order (w1, w2, w3).
function SwiGLU:init(cfg)
  local g = assert(cfg.group, "tensor-parallel SwiGLU: cfg.group is required")
  divisible("model.ffn_hidden", cfg.hidden, g)
  local std = cfg.std or 0.02
  self:add("w1", ColumnParallelLinear(cfg.dim, cfg.hidden, { bias = cfg.bias, std = std,
                                                             group = g }))
  self:add("w2", RowParallelLinear(cfg.hidden, cfg.dim, { bias = cfg.bias, group = g,
                                                          std = cfg.out_std or std }))
  self:add("w3", ColumnParallelLinear(cfg.dim, cfg.hidden, { bias = cfg.bias, std = std,
                                                             group = g }))
end

-- -- Gradient norm -------------------------------------------------------------------

-- The model's parameters as two arrays: sharded over the group, and replicated.
function M.split_params(model)
  local sharded, replicated, seen = {}, {}, {}
  for _, nm in ipairs(model:named_modules()) do
    local m = nm[2]
    for _, name in ipairs(m._param_names) do
      local p = m[name]
      local key = p ~= nil and tostring(ffi.cast("uintptr_t", ffi.cast("void *", p)))
      if key and not seen[key] then
        seen[key] = true
        local list = (m._tp_sharded and m._tp_sharded[name]) and sharded or replicated
        list[#list + 1] = p
      end
    end
  end
  return sharded, replicated
end

local norm_box = ffi.new("double[1]")

local function sq_norm(list)
  if #list == 0 then return 0.0 end
  tffi.check(C.tt_grad_norm(T.tensor_array(list), #list, norm_box), 3)
  return norm_box[0] * norm_box[0]
end

-- The global gradient norm of a tensor-parallel model: a sharded parameter's squares are
-- summed over the group (each shard once), a replicated one counts once. Clips every
-- gradient by min(1, max_norm / (norm + 1e-6)) like tt_clip_grad_norm; returns the norm.
function M.clip_grad_norm(sharded, replicated, group, max_norm)
  local sq = group:mean(sq_norm(sharded)) * group.size + sq_norm(replicated)
  local norm = math.sqrt(sq)
  if max_norm and max_norm > 0 and norm == norm and norm < math.huge then
    local coef = max_norm / (norm + 1e-6)
    if coef < 1.0 then
      for _, list in ipairs({ sharded, replicated }) do
        for _, p in ipairs(list) do
          local g = p.grad
          if g ~= nil then
            local s = T.scale(g, coef)
            tffi.check(C.tt_copy_(g, s), 2)
            free(s)
          end
        end
      end
    end
  end
  return norm
end

-- Routes opt:clip_grad_norm through the global norm of `model` over `group` (no-op for
-- a group of one).
function M.attach_optimizer(opt, model, group)
  if group.size == 1 then return end
  local sharded, replicated = M.split_params(model)
  opt.clip_grad_norm = function(_, max_norm)
    return M.clip_grad_norm(sharded, replicated, group, max_norm)
  end
end

return M
