-- tetra.parallel: the four parallel dimensions, applied to a built model from its plan.
--
--   local par = parallel.apply(model, plan, mesh, cfg)   -- pipeline, tensor, context
--   par:inputs(tokens)              -- (b, T + 1) -> this rank's ids, targets, positions
--   par:loss(logits, targets)       -- mean cross-entropy (vocab-parallel under TP)
--   par:placements()                -- every local parameter with its placement
--   par:sync_tied_grads()           -- tied copies on different stages: grads summed
--   par:clip_grad_norm(opt, max, shards)  -- the global norm of the whole model
--
-- One module per dimension, each readable on its own, built on tetra.dist's mesh:
--   tetra.parallel.data     data parallelism: bucketed gradient averaging overlapped with
--                           backward, ZeRO-1 (data.lua)
--   tetra.parallel.tensor   Megatron tensor and sequence parallelism: the styles a plan
--                           names (column, row, vocab, ...) (tensor.lua)
--   tetra.parallel.context  context parallelism: sequences cut into 2 cp chunks, K/V
--                           gathered over the cp group in attention (context.lua)
--   tetra.parallel.pipeline pipeline parallelism: blocks split into stages, GPipe and
--                           1F1B schedules over send/recv (pipeline.lua)
--   tetra.parallel.layout   every rule about sizes and combinations, checked before a
--                           model is built (layout.lua)
--   tetra.parallel.step     the step strategies: plain and pipelined (step.lua)
--
-- A plan (recipes/llama/plan.lua is one) says, by module path ("*" matches one path
-- component), how a model splits:
--   tensor   = { { path, style }, ... }   styles of tetra.parallel.tensor
--   context  = { path, ... }              attention modules that gather over cp
--   pipeline = { blocks = path, first = { path, ... }, last = { path, ... } }
--              the blocks list that stages divide, the modules only the first stage
--              keeps (the embedding) and those only the last one keeps (norm, head)
-- apply runs the dimensions in one fixed order: pipeline (drop what other stages hold),
-- tensor (slice what this rank holds), context (attention over the cp group). The model
-- must have been built whole from the seed on every rank, so every slice is the
-- single-process weights' and every layout starts where one process does; its randn
-- weights are lazy (tetra.h), so a slice draws its own elements only.
--
-- Placements. Every local parameter then carries (module._placement, read through
-- par:placements()) the part of the whole parameter it holds and whether it counts:
--   name     the parameter's name in the whole model (a tied head's copy on the last
--            stage is named after the embedding it copies)
--   shape    the whole parameter's shape; dim, offset, length: the range of dim held
--   primary  true on the one rank of a group of identical copies that counts it in the
--            gradient norm and writes it to checkpoints: tp rank 0 of a replicated
--            parameter; false for a tied copy on the last stage
--   tied     held on the first and last stage both (gradients summed over them)
-- The gradient norm, checkpoint shards and ZeRO-1 moments are derived from these, once.
local ffi = require("ffi")
local C = require("tetra.ffi").C
local T = require("tetra.tensor")
local F = require("tetra.nn.functional")
local layout = require("tetra.parallel.layout")

local parallel = {}

-- -- Plans --------------------------------------------------------------------------------

-- A Lua pattern for a plan path: dots literal, "*" one path component.
local function path_pattern(path)
  return "^" .. path:gsub("%.", "%%."):gsub("%*", "[^.]+") .. "$"
end
parallel.plan_pattern = path_pattern   -- tetra.planner matches plan paths the same way

-- Array of { path, module } of model's modules that match plan path `path`.
local function matching(model, path)
  local pat, out = path_pattern(path), {}
  for _, nm in ipairs(model:named_modules()) do
    if nm[1]:match(pat) then out[#out + 1] = nm end
  end
  return out
end

-- Every rank finds a plan's problem alike: reported once (tetra.dist.fail).
local function plan_error(fmt, ...)
  require("tetra.dist").fail("plan: " .. string.format(fmt, ...))
end

-- -- Applying a plan ----------------------------------------------------------------------

local Par = {}
Par.__index = Par

-- (module path, param name) of every parameter slot of model, in named_parameters
-- order, duplicates included (a tied head's weight appears under both modules).
local function slots(model)
  local out = {}
  for _, s in ipairs(model:param_slots()) do out[#out + 1] = { s[4], s[3], s[1], s[2] } end
  return out
end

local function apply_tensor(par, plan, g)
  local sliced, styled, groups = {}, {}, {}
  for _, entry in ipairs(plan.tensor or {}) do
    local path, style = entry[1], entry[2]
    local found = matching(par.model, path)
    if #found == 0 and not par.stage then
      plan_error("tensor entry '%s' matches no module of the model", path)
    end
    for _, nm in ipairs(found) do
      local parent = par.model:get(nm[1]:match("^(.*)%.[^.]+$") or "")
      require("tetra.parallel.tensor").apply(nm[2], nm[1], style, g,
        { sequence = par.sequence, sliced = sliced, groups = groups,
          head_dim = parent and parent.head_dim })
      styled[nm[2]] = true
    end
  end
  -- Sequence parallelism feeds every module between the styled regions a slice of the
  -- sequence: one holding parameters without a style would train on partial gradients.
  if par.sequence then
    for _, nm in ipairs(par.model:named_modules()) do
      local m = nm[2]
      if #m._param_names > 0 and not styled[m] then
        plan_error("under parallel.sequence_parallel every module with parameters needs a " ..
                   "tensor style; %s has none (a per-token module takes 'sequence')", nm[1])
      end
    end
  end
  local head
  for _, entry in ipairs(plan.tensor or {}) do
    if entry[2] == "vocab_head" then
      for _, nm in ipairs(matching(par.model, entry[1])) do head = nm[2] end
    end
  end
  par.vocab_head = head and head.vocab_start and head or nil
end

-- Applies plan to model (built whole on every rank) for the layout of cfg on mesh.
-- Returns par (see the top of this file).
function parallel.apply(model, plan, mesh, cfg)
  plan = plan or {}
  local lay = layout.sizes(cfg)
  local p = cfg.parallel or {}
  local par = setmetatable({ model = model, mesh = mesh, layout = lay, plan = plan,
                             sequence = p.sequence_parallel and lay.tp > 1 or false,
                             device = C.TT_CPU }, Par)
  -- Every slot's name in the whole model (by tensor: a shared tensor's first name).
  local whole, canonical, count = {}, {}, {}
  for _, s in ipairs(slots(model)) do
    local key = T.key(s[2])
    whole[key] = whole[key] or s[1]
    canonical[s[1]] = whole[key]
    count[whole[key]] = (count[whole[key]] or 0) + 1
  end
  if lay.pp > 1 then
    if not plan.pipeline then plan_error("this model's plan has no pipeline entry") end
    par.stage = require("tetra.parallel.pipeline").split(model, plan.pipeline, mesh.pp, cfg)
  end
  if lay.tp > 1 then apply_tensor(par, plan, mesh.tp) end
  if lay.cp > 1 then
    for _, path in ipairs(plan.context or {}) do
      for _, nm in ipairs(matching(model, path)) do
        require("tetra.parallel.context").apply(nm[2], mesh.cp)
      end
    end
  end
  -- Placements.
  local present, local_count = {}, {}
  local now = slots(model)
  for _, s in ipairs(now) do present[s[1]] = true end
  for _, s in ipairs(now) do
    local name = canonical[s[1]]
    local_count[name] = (local_count[name] or 0) + 1
  end
  local tied = {}
  for _, s in ipairs(now) do
    local m, pname, name = s[3], s[4], canonical[s[1]]
    m._placement = m._placement or {}
    local pl = m._placement[pname]
    if not pl then
      local shape = s[2]:shape()
      pl = { dim = 0, offset = 0, length = shape[1], shape = shape }
      m._placement[pname] = pl
    end
    pl.name = name
    pl.tied = count[name] > local_count[name] or nil   -- some copies are on other stages
    -- Counted once: a slice by the first of the ranks that hold it, a whole parameter by
    -- tp rank 0, a tied copy not on the stage that owns the parameter.
    if pl.split then
      pl.primary = (pl.copy_rank or 0) == 0
    else
      pl.primary = mesh.tp.rank == 0
    end
    pl.primary = pl.primary and present[name] or false
    if pl.tied and not tied[name] then
      tied[name] = true
      -- (where the parameter is, not the tensor: moving the model to a GPU replaces it)
      tied[#tied + 1] = { name = name, module = m, pname = pname }
    end
  end
  table.sort(tied, function(a, b) return a.name < b.name end)   -- the same order everywhere
  par.tied = tied
  -- The first and last stage sum a tied parameter's gradients (every pp rank joins the
  -- split; only a model with shared parameters needs the group).
  local shared = false
  for _, n in pairs(count) do shared = shared or n > 1 end
  if lay.pp > 1 and shared then
    local st = par.stage
    par.tied_group = mesh.pp:split((st.is_first or st.is_last) and 0 or 1, st.stage, "tied")
  end
  return par
end

-- -- Placements -----------------------------------------------------------------------------

-- Array of { name, tensor, placement } for every local parameter (each tensor once, in
-- named_parameters order).
function Par:placements()
  local out, seen = {}, {}
  for _, s in ipairs(slots(self.model)) do
    local key = T.key(s[2])
    if not seen[key] then
      seen[key] = true
      local pl = s[3]._placement and s[3]._placement[s[4]]
      out[#out + 1] = { name = pl and pl.name or s[1], tensor = s[2], placement = pl or
                        { dim = 0, offset = 0, length = s[2]:shape()[1], shape = s[2]:shape(),
                          primary = true, name = s[1] } }
    end
  end
  return out
end

-- Bytes of this rank's parameters, their gradients and the optimizer state of `opt`.
-- ddp (optional): tetra.parallel.data's wrapper; under ZeRO-2 and 3 the gradients a rank
-- keeps are its shards', under ZeRO-3 the parameters too (outside the blocks: whole).
function Par:memory(opt, ddp)
  local params, state = 0, 0
  local released = ddp and ddp.zero_stage == 3 and ddp.released or {}
  for _, e in ipairs(self:placements()) do
    if not released[T.key(e.tensor)] then params = params + 4 * e.tensor:numel() end
  end
  -- ZeRO-3: a block's parameters hold memory only while it runs; the rank keeps its
  -- share of every parameter (the master weights) besides the whole ones outside them.
  if ddp and ddp.zero_stage == 3 and ddp.shards then
    for _, s in ipairs(ddp.shards) do params = params + 4 * s.tensor:numel() end
  end
  for _, list in ipairs({ opt.m or {}, opt.v or {}, opt.buffers or {} }) do
    for _, t in ipairs(list) do state = state + 4 * t:numel() end
  end
  local grads = params
  if ddp and ddp.zero_stage >= 2 and ddp.shards then
    grads = 0
    for _, s in ipairs(ddp.shards) do grads = grads + 4 * s.tensor:numel() end
  end
  -- Offloaded moments (parallel.offload_optimizer) are host memory, not the device's.
  if opt.offloaded then
    return { params = params, grads = grads, optimizer = 0, host_optimizer = state,
             host_masters = opt.host_master_bytes and opt:host_master_bytes() or 0,
             released_masters = opt.released_master_bytes and opt:released_master_bytes() or 0 }
  end
  return { params = params, grads = grads, optimizer = state }
end

-- -- The step ----------------------------------------------------------------------------------

-- This rank's part of tokens (b, T + 1): ids (b, t) and targets (b, t) (t = T / cp), and
-- their positions in the sequence ((t) i64; nil without context parallelism), on the
-- device of tokens.
function Par:inputs(tokens)
  local ids, targets, positions
  if self.layout.cp > 1 then
    ids, targets, positions = require("tetra.parallel.context").slice(tokens, self.mesh.cp)
  else
    ids, targets = F.inputs_targets(tokens)
  end
  return ids, targets, positions
end

-- The length of this rank's ids (Par:inputs) for a sequence of T tokens: T, or its two
-- chunks under context parallelism (tetra.parallel.context).
function Par:ids_len(T)
  if self.layout.cp == 1 then return T end
  return 2 * require("tetra.parallel.context").chunk_len(T, self.layout.cp)
end

-- The sequence length of the activations between blocks for this rank's ids of length
-- t: t, or t / tp under sequence parallelism.
function Par:activation_len(t)
  return self.sequence and t / self.layout.tp or t
end

-- Mean cross-entropy of logits (b, t, V) (this rank's vocabulary columns under tensor
-- parallelism) against targets (b, t).
function Par:loss(logits, targets)
  local head = self.vocab_head
  if head then
    return require("tetra.parallel.tensor").vocab_parallel_cross_entropy(
      logits, targets, self.mesh.tp, head.vocab_start)
  end
  return F.cross_entropy(logits, targets)
end

-- The full (..., vocab_size) logits of forward's (gathered over the tensor-parallel
-- group when the head splits the vocabulary).
function Par:full_logits(logits)
  local head = self.vocab_head
  if not head then return logits end
  local pl = head._placement.weight
  local V, part = pl.shape[1], math.ceil(pl.shape[1] / self.layout.tp)
  if part * self.layout.tp == V then return self.mesh.tp:gather_from_group(logits, -1) end
  -- The last rank holds fewer rows: every rank sends `part` columns (zeros after its
  -- own), and the whole vocabulary is the first V columns of what arrives, on every rank
  -- (rank 0, whose share is whole, once kept the padding as logits of tokens past the
  -- vocabulary, which a draw could pick). The padding has the logits' dtype and device,
  -- as the other ranks' do (bf16 logits padded in f32, or on the host beside the others'
  -- GPUs, broke the gather).
  local shape = logits:shape()
  shape[#shape] = part
  local padded = F.zeros(shape, logits._dtype, logits._device)
  local own = F.narrow(padded, #shape - 1, 0, pl.length)
  require("tetra.ffi").check(C.tt_copy_(own, logits))
  F.free(own)
  local all = self.mesh.tp:gather_from_group(padded, -1)
  F.free(padded)
  local v = F.narrow(all, #shape - 1, 0, V)
  local full = F.contiguous(v)
  F.free(v); F.free(all)
  return full
end

-- A parameter held by the first and the last stage (a tied embedding and head): each
-- stage's gradient covers its own use, so the two are summed and both copies step alike.
function Par:sync_tied_grads()
  if not self.tied_group then return end
  local st = self.stage
  if not (st.is_first or st.is_last) then return end
  for _, e in ipairs(self.tied) do
    local g = e.module[e.pname].grad
    if g == nil then error("tied parameter " .. e.name .. " has no gradient after backward", 0) end
    self.tied_group:all_reduce(g, "sum")
    F.free(g)   -- the borrowed reference: left to the GC it keeps the gradient alive
  end
end

-- Whether the gradient norm needs the other ranks: some parameters are split or exist
-- once over several ranks (tensor, pipeline parallelism, ZeRO-1 shards).
function Par:global_norm()
  return self.layout.tp > 1 or self.layout.pp > 1
end

local norm_box = ffi.new("double[1]")

local function sq_norm(list)
  if #list == 0 then return 0.0 end
  require("tetra.ffi").check(C.tt_grad_norm(T.tensor_array(list), #list, norm_box), 3)
  return norm_box[0] * norm_box[0]
end

-- The gradient norm of the whole model and clipping by it: the squares of the primary
-- copies (each parameter, or each ZeRO-1 shard of one, once), summed over every rank.
-- shards: ddp.shards under ZeRO-1 and 2 (the optimizer's params are those shards), else nil.
-- Scales every gradient the optimizer uses by min(1, max_norm / (norm + 1e-6)), as
-- tt_clip_grad_norm does (AdamW: in its update, from the coefficient computed on the
-- device). Returns the norm; with async (AdamW only) nothing: the norm stays in the
-- optimizer's stats for the step's one read.
function Par:clip_grad_norm(opt, max_norm, shards, async)
  -- The counted tensors stay the same from step to step: listed once.
  local counted = self._counted
  if not counted then
    counted = {}
    local params = self:placements()
    if shards then
      for _, s in ipairs(shards) do
        if params[s.param].placement.primary then counted[#counted + 1] = s.tensor end
      end
    else
      for _, e in ipairs(params) do
        if e.placement.primary then counted[#counted + 1] = e.tensor end
      end
    end
    self._counted = counted
  end
  -- Without ZeRO-1 or 2 every dp x cp replica holds the same gradients: counted once.
  local replicas = shards and 1 or self.mesh.dpcp.size
  if opt.clip_grad_norm_async then
    -- AdamW: the sums of squares gathered and added on the device, the coefficient
    -- applied by its update; one read of the norm.
    opt:clip_grad_norm_async(max_norm, counted, { group = self.mesh.world, replicas = replicas })
    if async then return nil end
    return opt:read_stats().grad_norm
  end
  assert(not async, "clip_grad_norm: async needs an optimizer with device stats (AdamW)")
  local norm = math.sqrt(self.mesh.world:sum(sq_norm(counted)) / replicas)
  if max_norm and max_norm > 0 and norm == norm and norm < math.huge then
    local coef = max_norm / (norm + 1e-6)
    if coef < 1.0 then
      for _, p in ipairs(opt.params) do
        local g = p.grad
        if g ~= nil then
          local s = T.scale(g, coef)
          require("tetra.ffi").check(C.tt_copy_(g, s))
          F.free(s)
          -- A borrowed reference: left to the GC, it would keep this step's gradient
          -- alive after zero_grad, one whole set of gradients more per step.
          F.free(g)
        end
      end
    end
  end
  return norm
end

return setmetatable(parallel, {
  __index = function(t, k)
    local ok, mod = pcall(require, "tetra.parallel." .. k)
    if not ok then
      if tostring(mod):find("module 'tetra.parallel." .. k .. "' not found", 1, true) then
        return nil
      end
      error(mod, 2)
    end
    rawset(t, k, mod)
    return mod
  end,
})
