-- tetra.parallel.tensor: Megatron-style tensor parallelism (and sequence parallelism) over
-- the mesh's tp group, applied to a built model module by module.
--
--   tensor.apply(module, style, group, opts)   -- opts.sequence: sequence parallelism
--   tensor.vocab_parallel_cross_entropy(logits, targets, group, vocab_start)
--
-- Styles (the `tensor` entries of a model's plan, recipes/*/plan.lua):
--   column      a Linear whose output features (W rows, bias) are split: x replicated
--               goes in through copy_to_group (identity forward; backward all-reduces dx,
--               every rank having used the same x); the output stays split.
--   heads_column  column-parallel by whole attention heads (key and value projections):
--               with fewer heads than ranks each head sits on tp / heads ranks, whose
--               weight gradients (from their own query heads) are summed.
--   row         a Linear whose input features (W columns) are split: the partial
--               products are summed by reduce_from_group; the bias (replicated) is added
--               once, after the sum.
--   vocab       an Embedding whose rows (the vocabulary) are split: ids outside this
--               rank's rows give 0, and the all-reduce adds the owner's row. A
--               vocabulary tp does not divide splits unevenly (the last rank holds fewer
--               rows): no padding enters the loss.
--   vocab_head  a language-model head: column-parallel, the logits stay split over the
--               vocabulary and the loss is the vocab-parallel cross-entropy.
--   sequence    a per-token module (a norm) that holds replicated weights.
--   sequence_output  a replicated module whose output is cut along the sequence (learned
--               position embeddings).
-- With sequence parallelism the residual stream between those regions holds this rank's
-- 1/tp of the sequence (dim -2 of an activation): column and vocab_head gather it
-- (sp_gather: backward reduce-scatters), row and vocab reduce-scatter their output
-- instead of all-reducing it, `sequence` modules run on the slice (their weights go
-- through copy_to_group, so each weight gradient is summed over the group: every rank saw
-- different tokens) and `sequence_output` modules keep this rank's slice of their output.
-- Without it, the last two styles change nothing.
--
-- A sliced parameter is this rank's part of the full one the module was built with (the
-- single-process weights for the same seed); its placement (tetra.parallel) records which
-- part: dim, offset and length of the full shape.
local ffi = require("ffi")
local tffi = require("tetra.ffi")
tffi.cdef_header("tetra_vocab_parallel.h")
local T = require("tetra.tensor")
local F = require("tetra.nn.functional")

local C = ffi.C
local free = F.free
local M = {}

-- -- Slicing ----------------------------------------------------------------------------

-- The part of `n` rows that rank `rank` of `size` holds: offset, length. Equal parts
-- when size divides n; else (a vocabulary) parts of ceil(n / size) rows, the last rank
-- holding what is left, so the split logits of all ranks gathered side by side are the
-- whole vocabulary followed by padding.
function M.part(n, size, rank)
  local len = math.ceil(n / size)
  local offset = rank * len
  return offset, math.max(0, math.min(len, n - offset))
end

-- Rows [offset, offset + length) of param `name` of module m along dim, as a new leaf
-- parameter; `sliced` (tensor key -> slice) makes a tensor two modules share (a tied
-- embedding and head) one shared slice. Records the placement; copy_rank (optional): this
-- rank's index among the ranks that hold the same slice.
local function slice_param(m, name, dim, offset, length, sliced, copy_rank)
  local p = m[name]
  if p == nil then return end
  local key = T.key(p)
  local full = p:shape()
  local s = sliced[key]
  if not s then
    s = T.no_grad(function()
      -- A copy, never a view: rows of dim 0 are contiguous already, and a view would
      -- keep the whole matrix allocated on every rank for as long as the slice lives.
      local v = F.narrow(p, dim, offset, length)
      local c = T.take(C.tt_clone(v, T.pout))
      free(v)
      return c
    end)
    s = F.parameter(s)
    sliced[key] = s
  end
  m[name] = s
  m._placement = m._placement or {}
  m._placement[name] = { dim = dim, offset = offset, length = length, shape = full,
                         split = true, copy_rank = copy_rank }
end

-- The part of parameter `pname` (shape: the whole parameter's) of a module of style
-- `style` that rank `rank` of `size` holds: { dim, offset, length, copy_rank }, or nil
-- when every rank holds it whole. column, vocab and vocab_head split dim 0 (the output
-- features, the vocabulary) in parts of M.part; heads_column too, by whole heads of
-- head_dim rows, and with fewer heads than ranks gives each head to size / heads ranks
-- (copy_rank: this rank's index among them); row splits dim 1 of the weight (the input
-- features: its bias is added once, after the sum). tetra.planner prices these slices.
function M.slice(style, pname, shape, size, rank, head_dim)
  local dim
  if style == "column" or style == "vocab" or style == "vocab_head" then
    dim = 0
  elseif style == "heads_column" then
    local heads = shape[1] / head_dim
    if heads < size then
      local per = size / heads
      local head = math.floor(rank / per)
      return { dim = 0, offset = head * head_dim, length = head_dim, copy_rank = rank % per }
    end
    dim = 0
  elseif style == "row" and pname == "weight" then
    dim = 1
  else
    return nil
  end
  local offset, length = M.part(shape[dim + 1], size, rank)
  return { dim = dim, offset = offset, length = length }
end

-- slice_param for this rank's part (M.slice) of param `name` of m under `style`.
local function split_param(m, name, style, group, opts)
  local p = m[name]
  if p == nil then return end
  local s = M.slice(style, name, p:shape(), group.size, group.rank, opts.head_dim)
  slice_param(m, name, s.dim, s.offset, s.length, opts.sliced, s.copy_rank)
end

-- The sequence dim of an activation (B, T, D) or (T, D): the one before the features.
local function seq_dim(x) return x._ndim - 2 end

-- -- Forward of each style ------------------------------------------------------------------

-- x replicated (or this rank's sequence slice under sequence parallelism) -> the
-- replicated whole-sequence input every rank multiplies by its slice of W.
local function gather_input(g, sp, x)
  if sp then return g:sp_gather(x, seq_dim(x)) end
  return g:copy_to_group(x)
end

-- Partial sums -> their sum (replicated, or this rank's sequence slice).
local function reduce_output(g, sp, part)
  if sp then return g:sp_reduce_scatter(part, seq_dim(part)) end
  return g:reduce_from_group(part)
end

-- The input transform of the column-parallel layers of group g (and sp): one function
-- per (g, sp), which nn.linears finds on each layer (group_input) to run the layers that
-- read one x (q/k/v, w1 | w3) as one GEMM on one gathered input.
local input_fns = setmetatable({}, { __mode = "k" })
local function group_input(g, sp)
  local per = input_fns[g] or {}
  input_fns[g] = per
  local key = sp and "sp" or "plain"
  per[key] = per[key] or function(x) return gather_input(g, sp, x) end
  return per[key]
end

local function column_forward(g, sp)
  return function(self, x)
    local xc = gather_input(g, sp, x)
    local y = self.gemm(xc, self.weight, self.bias)
    free(xc)
    return y
  end
end

-- A column-parallel layer whose slice (a key/value head) several ranks hold: its weights
-- go through copy_to_group over those ranks (`copies`), so their gradients, each from
-- the rank's own query heads, are summed.
local function replicated_column_forward(g, sp, copies)
  return function(self, x)
    local xc = gather_input(g, sp, x)
    local w = copies:copy_to_group(self.weight)
    local b = self.bias ~= nil and copies:copy_to_group(self.bias) or nil
    local y = self.gemm(xc, w, b)
    free(xc); free(w); free(b)
    return y
  end
end

local function row_forward(g, sp)
  return function(self, x)
    local part = self.gemm(x, self.weight, nil)
    local y = reduce_output(g, sp, part)
    free(part)
    if self.bias == nil then return y end
    -- Under sequence parallelism each rank adds the bias to other tokens: its gradient
    -- is summed over the group by the copy.
    local b = sp and g:copy_to_group(self.bias) or self.bias
    local yb = F.add(y, b)
    free(y)
    if b ~= self.bias then free(b) end
    return yb
  end
end

-- The vocabulary-parallel lookup: this rank's rows for the ids it owns, zero rows for the
-- others' (tt_embedding_band, on the ids' device: no host round trip), summed over the
-- group (or reduce-scattered under sequence parallelism).
local function vocab_forward(g, sp, start)
  return function(self, ids)
    local e = F.embedding_band(self.weight, ids, start)
    local y = reduce_output(g, sp, e)
    free(e)
    return y
  end
end

-- Runs the module's own forward with each of its parameters passed through
-- copy_to_group, so that their gradients are summed over the group.
local function sequence_forward(g, forward)
  return function(self, ...)
    local own = {}
    for _, name in ipairs(self._param_names) do
      local p = self[name]
      if p ~= nil then
        own[name] = p
        self[name] = g:copy_to_group(p)
      end
    end
    local ok, y = pcall(forward, self, ...)
    for name, p in pairs(own) do
      free(self[name])
      self[name] = p
    end
    if not ok then error(y, 0) end
    return y
  end
end

local function sequence_output_forward(g, forward)
  return function(self, ...)
    local y = forward(self, ...)
    local s = g:scatter_to_group(y, seq_dim(y))
    free(y)
    return s
  end
end

-- -- Applying a style ----------------------------------------------------------------------

local LINEAR_STYLES = { column = true, heads_column = true, row = true, vocab_head = true }

-- Applies `style` to module m (its path `path`, for errors) over group g.
-- opts: sequence (sequence parallelism), sliced (shared slices, see slice_param),
-- head_dim (of the attention that holds m: heads_column splits whole heads), groups (a
-- cache of subgroups of g).
function M.apply(m, path, style, g, opts)
  local sp = opts.sequence
  if LINEAR_STYLES[style] and not m.gemm then
    error(string.format("plan: %s is a %s, not a Linear: it cannot be %s-parallel", path,
                        m.__name, style), 0)
  end
  local function even(n, what)
    if n % g.size ~= 0 then
      error(string.format("plan: %s: %s (%d) does not divide by parallel.tensor_parallel_size " ..
                          "(%d)", path, what, n, g.size), 0)
    end
  end
  if style == "column" then
    even(m.out_features, "its output features")
    split_param(m, "weight", style, g, opts)
    split_param(m, "bias", style, g, opts)
    m.forward = column_forward(g, sp)
    m.group_input = group_input(g, sp)
  elseif style == "heads_column" then
    local hd = assert(opts.head_dim, "heads_column needs the attention's head_dim")
    local heads = m.out_features / hd
    if heads >= g.size then
      even(heads, "its heads")
      split_param(m, "weight", style, g, opts)
      split_param(m, "bias", style, g, opts)
      m.forward = column_forward(g, sp)
      m.group_input = group_input(g, sp)
    else   -- fewer heads than ranks: each head on size / heads ranks (M.slice)
      local head = M.slice(style, "weight", m.weight:shape(), g.size, g.rank, hd).offset / hd
      local key = "heads" .. heads
      opts.groups[key] = opts.groups[key] or g:split(head, g.rank, g.name .. ".kv")
      split_param(m, "weight", style, g, opts)
      split_param(m, "bias", style, g, opts)
      m.forward = replicated_column_forward(g, sp, opts.groups[key])
    end
  elseif style == "vocab_head" then
    split_param(m, "weight", style, g, opts)
    split_param(m, "bias", style, g, opts)
    m.forward = column_forward(g, sp)
    m.vocab_start = m._placement.weight.offset
  elseif style == "row" then
    even(m.in_features, "its input features")
    split_param(m, "weight", style, g, opts)
    m.forward = row_forward(g, sp)
  elseif style == "vocab" then
    if m.__name ~= "Embedding" then
      error(string.format("plan: %s is a %s, not an Embedding: it cannot be vocab-parallel",
                          path, m.__name), 0)
    end
    split_param(m, "weight", style, g, opts)
    local pl = m._placement.weight
    m.forward = vocab_forward(g, sp, pl.offset)
  elseif style == "sequence" then
    if sp then m.forward = sequence_forward(g, m.forward) end
  elseif style == "sequence_output" then
    if sp then m.forward = sequence_output_forward(g, m.forward) end
  else
    error(string.format("plan: unknown tensor-parallel style '%s' for %s (column, " ..
                        "heads_column, row, vocab, vocab_head, sequence, sequence_output)",
                        tostring(style), path), 0)
  end
end

-- -- Loss ----------------------------------------------------------------------------------

-- logits: (..., V / tp) this rank's vocabulary columns starting at vocab_start; targets:
-- (...) global ids -> the scalar mean cross-entropy of the full logits (every rank).
-- bf16 logits (a bf16 head) go in as they are: the op widens them row by row, and its
-- max and sums travel in f32.
function M.vocab_parallel_cross_entropy(logits, targets, group, vocab_start, ignore_index)
  return T.take(C.tt_vocab_parallel_cross_entropy(group._c, logits, targets, vocab_start,
                                                  ignore_index or -100, T.pout), 2)
end

return M
