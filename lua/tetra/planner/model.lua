-- tetra.planner.model: a model as the planner counts it: its parameters (from its
-- folder's presets.lua) sliced by its plan as tetra.parallel.tensor slices them, kept per
-- pipeline stage as tetra.parallel.pipeline splits the blocks, its matmuls and FLOPs.
local C = require("tetra.ffi").C
local tensor_split = require("tetra.parallel.tensor")
local pipeline = require("tetra.parallel.pipeline")
local models = require("tetra.models")
local flops = require("tetra.obs.mfu").flops

local M = {}

-- Bytes the caching allocator grants a request of `bytes` (its size class).
function M.granted(bytes)
  if bytes <= 0 then return 0 end
  return tonumber(C.tt_alloc_granted_bytes(bytes))
end

-- What the planner derives from a model is asked again for every layout it weighs (tens
-- of thousands for a 64-GPU cluster) and depends only on the model's settings and a few
-- sizes: kept per key, the model's scalar settings (sorted) and those sizes. The results
-- are shared: callers read them, never change them.
local memo, memo_n = {}, 0
local function model_key(m)
  local keys = {}
  for k, v in pairs(m) do
    local t = type(v)
    if t == "number" or t == "string" or t == "boolean" then keys[#keys + 1] = k end
  end
  table.sort(keys)
  for i, k in ipairs(keys) do keys[i] = k .. "=" .. tostring(m[k]) end
  return table.concat(keys, ",")
end
local function memoized(what, f)
  return function(m, ...)
    local key = what .. "|" .. model_key(m) .. "|" .. table.concat({ ... }, ",")
    local hit = memo[key]
    if not hit then
      if memo_n >= 20000 then memo, memo_n = {}, 0 end
      hit = { f(m, ...) }
      memo[key], memo_n = hit, memo_n + 1
    end
    return unpack(hit)
  end
end

-- Every parameter of the whole model as { module path, param name, shape }, in the
-- order its forward uses them (recipes/<family>/presets.lua lists them). m: cfg.model.
M.parameters = memoized("parameters", function(m)
  return models.of(m).parameters(m)
end)

-- Whether the head reuses the embedding's matrix.
local function tied(m)
  return models.of(m).tied == true or m.tie_embeddings == true
end
M.tied = tied

-- The model's parallel plan (recipes/<family>/plan.lua).
function M.model_plan(m)
  return models.plan(models.of(m).name)
end

-- The tensor-parallel style the plan gives module `path`, nil when none.
local function style_of(plan, path)
  for _, e in ipairs(plan.tensor or {}) do
    if path:match(require("tetra.parallel").plan_pattern(e[1])) then return e[2] end
  end
end

-- Elements of param `name` (shape, of a module with `style`) that tp rank `r` holds:
-- the slice tetra.parallel.tensor gives it (tensor.slice).
local function local_numel(shape, name, style, tp, r, head_dim)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local part = tp > 1 and style and tensor_split.slice(style, name, shape, tp, r, head_dim)
  if not part then return n end
  return n / shape[part.dim + 1] * part.length
end

-- The blocks (0-based layer indices) of pipeline stage s (0-based) of pp, chunk by chunk:
-- { {first, last}, ... } one per virtual chunk, as tetra.parallel.pipeline splits them.
function M.stage_blocks(L, pp, v, s)
  local counts = pipeline.stage_layers(L, pp * v)
  local starts, at = {}, 0
  for i = 1, #counts do starts[i] = at; at = at + counts[i] end
  local out = {}
  for c = 0, v - 1 do
    local vs = c * pp + s + 1
    out[#out + 1] = { starts[vs], starts[vs] + counts[vs] - 1 }
  end
  return out
end

-- This rank's parameters: a list of element counts (one per tensor, a tied matrix once
-- per stage that holds it), for tp rank r on pipeline stage s. Also returns the elements
-- of matmul weights (for FLOPs) split as { blocks = per-block, head = ... }.
-- The second result: elements per block held (layer index -> elements), the units
-- ZeRO-3 gathers.
local function rank_params(m, pp, v, tp, s, r)
  local lay = { pp = pp, v = v, tp = tp }
  local plan = M.model_plan(m)
  local pplan = plan.pipeline or {}
  local hd = m.dim / m.n_heads
  local blocks = M.stage_blocks(m.n_layers, lay.pp, lay.v, s)
  local function keeps(path)
    local layer = path:match("^[%w_]+%.(%d+)%.")
    if layer then
      layer = tonumber(layer)
      for _, b in ipairs(blocks) do
        if layer >= b[1] and layer <= b[2] then return true end
      end
      return false
    end
    local root = path:match("^[^.]+")
    for _, p in ipairs(pplan.first or {}) do if p == root then return s == 0 end end
    for _, p in ipairs(pplan.last or {}) do if p == root then return s == lay.pp - 1 end end
    return true
  end
  local fam = models.of(m)
  local tensors, seen_tied, per_block = {}, false, {}
  for _, e in ipairs(M.parameters(m)) do
    local path, name, shape = e[1], e[2], e[3]
    local is_head, is_embed = path == fam.head, path == fam.embedding
    local skip = false
    if tied(m) and (is_head or is_embed) then
      -- One matrix: held once on a single stage, once on each end stage otherwise.
      if lay.pp == 1 then skip = seen_tied; seen_tied = true end
    end
    if not skip and keeps(path) then
      local n = local_numel(shape, name, style_of(plan, path), lay.tp, r, hd)
      tensors[#tensors + 1] = n
      local layer = tonumber(path:match("^[%w_]+%.(%d+)%."))
      if layer then per_block[layer] = (per_block[layer] or 0) + n end
    end
  end
  return tensors, per_block
end
rank_params = memoized("rank_params", rank_params)
function M.rank_params(m, lay, s, r)
  return rank_params(m, lay.pp, lay.v, lay.tp, s, r)
end

-- The matmuls of one block on a tp rank, in the order its forward runs them (the order
-- M.parameters lists them: q, k, v, o, then the MLP's), each { weights = elements,
-- out = output features per token, path = the module's, in block 0 }: a row-parallel
-- output is whole (partial sums).
M.block_matmuls = memoized("block_matmuls", function(m, tp)
  local plan = M.model_plan(m)
  local hd = m.dim / m.n_heads
  local out = {}
  for _, e in ipairs(M.parameters(m)) do
    local path, name, shape = e[1], e[2], e[3]
    if #shape == 2 and name == "weight" and path:match("^[%w_]+%.0%.") then
      local style = style_of(plan, path)
      local w = local_numel(shape, name, style, tp, 0, hd)
      local features = style == "row" and shape[1] or w / shape[2]
      out[#out + 1] = { weights = w, out = features, path = path }
    end
  end
  return out
end)

-- Elements of one block's matmul weights on a tp rank, and of the head's.
function M.matmul_params(m, tp)
  local plan = M.model_plan(m)
  local hd = m.dim / m.n_heads
  local block, head = 0, 0
  for _, mm in ipairs(M.block_matmuls(m, tp)) do block = block + mm.weights end
  local head_path = models.of(m).head
  for _, e in ipairs(M.parameters(m)) do
    local path, name, shape = e[1], e[2], e[3]
    if path == head_path then
      head = local_numel(shape, name, style_of(plan, path), tp, 0, hd)
    end
  end
  return block, head
end

-- Model FLOPs per token (forward + backward) as Megatron-LM and torchtitan count them
-- (tetra.obs.mfu.flops), the multiplied parameters being the matmul weights (blocks and
-- head; not the embedding lookup).
function M.flops_per_token(m)
  local block, head = M.matmul_params(m, 1)
  return flops(m.n_layers * block + head, m)
end

-- Parameters of the whole model (a tied matrix once).
function M.parameter_count(m)
  local n = 0
  for _, e in ipairs(M.parameters(m)) do
    local k = 1
    for _, s in ipairs(e[3]) do k = k * s end
    if not (tied(m) and e[1] == models.of(m).head) then n = n + k end
  end
  return n
end

return M
