-- tetra.parallel.data: data parallelism.
--
--   local ddp = tetra.parallel.data.wrap(entries, mesh, cfg, model)
--   ddp:attach_optimizer(opt)          -- once, after creating the optimizer (ZeRO-1)
--   per optimizer step:
--     ddp:begin_step()
--     local mine = ddp:batch_slice(global_batch)   -- this DP rank's rows
--     for each micro-batch: ddp:before_backward(is_last); loss:backward()
--     ddp:finish_grads()               -- grads hold the average over the DP group
--     ddp:optimizer_step(opt)
--
-- Each DP rank computes the gradient of its rows; the average over ranks is the
-- gradient of the whole global batch, so the run follows the single-process loss curve.
-- The averaging is done by the C reducer (engine/dist/reducer.c): gradients are packed
-- into buckets of at most cfg.dist.bucket_mb (default 25), smaller toward the end of
-- backward (the last 1/32 of the gradient bytes), that start reducing while backward
-- still runs, armed only for the last micro-batch of an accumulation.
-- An embedding table's gradient is the last one backward produces, so nothing is left
-- to overlap its reduction with; a step's tokens touch few of its rows, so with
-- cfg.dist.sparse_embedding_grad = true (default false: README, Performance) only the
-- rows some rank touched travel (the result is the dense average; data.row_sparse says
-- which parameters qualify).
-- The first blocks' weight gradients are computed after the tables' (data.tail_order),
-- so that the tables' reduction overlaps them; ddp.deferred says how many parameters, and
-- after finish_grads ddp.held how many buckets waited for an earlier one (0 when the
-- order is right).
-- After finish_grads, ddp.exposed_comm_s is the time it waited and ddp.sparse_rows the
-- rows that travelled that way (-1: none did, e.g. past half the table).
-- With cp > 1 the gradients are averaged over dp x cp (the ranks that hold the same
-- parameters).
--
-- ZeRO-1 (cfg.parallel.zero_stage = 1): buckets are reduce-scattered; each rank keeps
-- AdamW moments for its 1/n share of every bucket only, updates that share of the
-- parameters in place, and the shares are all-gathered after the step. The fp32
-- parameters themselves are the master weights on CPU.
-- ZeRO-2 (zero_stage = 2): the same shards, and each rank keeps only its share of the
-- gradients: the reducer releases a parameter's whole gradient once it is in its bucket
-- and the bucket once reduce-scattered (engine/dist/reducer.c). Micro-batches before the
-- last of an accumulation still add into whole gradients (one reduce-scatter per step);
-- the memory saved is the gradients and buckets between backward and the next step's
-- last backward, and during that backward as buckets land. Everything below that says
-- ZeRO-1 holds for stage 2.
-- ZeRO-3 (zero_stage = 3): the parameters too (FSDP's full sharding). Each block of the
-- plan's blocks list (plan.pipeline.blocks) is a unit: its parameters hold memory only
-- from the all-gather before its forward to the end of that forward, and again from the
-- all-gather before its backward (run by an identity op recorded after the block, so it
-- comes before the block's backward on the tape) to the end of the backward; the next
-- block's gather starts before each block runs (prefetch). The parameters before and after
-- the blocks (embedding, final norm, head) are one unit each that stays gathered, as
-- FSDP's root unit without resharding: gathered again after each optimizer step. The
-- master weights a rank keeps are its share of every unit, in a buffer of the reducer's
-- (engine/dist/reducer.c; with optimizer offload in bf16 / fp16 on the host from the
-- forward to the update: master_shares); a checkpoint puts each parameter together from
-- the shares on the rank that writes it alone (gather_to_owners), and a load reads each
-- rank's shares alone. Gradients go as under stage 2.
local ffi = require("ffi")
local tffi = require("tetra.ffi")
tffi.cdef_header("tetra_dist.h")
local tensor = require("tetra.tensor")
local F = require("tetra.nn.functional")

local C = ffi.C
local data = {}

local function check(status)
  if status ~= 0 then error(ffi.string(C.tt_last_error()), 3) end
end

local DDP = {}
DDP.__index = DDP

-- The model's Embedding tables: key -> true, and how many module slots hold each tensor.
local function embedding_tables(model)
  local users, tables = {}, {}
  for _, slot in ipairs(model:param_slots()) do
    local m, pname, key = slot[1], slot[2], tensor.key(slot[3])
    users[key] = (users[key] or 0) + 1
    if m.__name == "Embedding" and pname == "weight" then tables[key] = true end
  end
  return tables, users
end

-- Flags (1 or 0, aligned with entries, par:placements()'s list) of the parameters whose
-- gradient travels as touched rows under cfg.dist.sparse_embedding_grad = true: an
-- Embedding's f32 weight that no other module of model shares and no other pipeline
-- stage holds (a tied head's gradient fills every row). nil when none does.
function data.row_sparse(model, entries, cfg)
  if not ((cfg and cfg.dist) or {}).sparse_embedding_grad then return nil end
  local tables, users = embedding_tables(model)
  local flags, any = {}, false
  for i, e in ipairs(entries) do
    local t, key = e.tensor, tensor.key(e.tensor)
    local ok = tables[key] and users[key] == 1 and not (e.placement and e.placement.tied) and
               t.ndim == 2 and t.dtype == "f32"
    flags[i] = ok and 1 or 0
    any = any or ok
  end
  return any and flags or nil
end

-- The order backward finishes the gradients of entries (0-based indices, the last one
-- first) when the first blocks' weight gradients are deferred (cfg.dist.defer_weight_grads,
-- default true), and how many lead it (deferred). The embedding tables a model starts with
-- are looked up first in forward, so backward produces their gradients last, with nothing
-- left to overlap their reduction with; deferring the weight gradients of the parameters
-- that follow them (as many bytes as the tables, at most half of the rest) moves the
-- tables' reduction before that work. nil when entries do not start with a table.
function data.tail_order(model, entries, cfg)
  if ((cfg and cfg.dist) or {}).defer_weight_grads == false then return nil end
  local tables = embedding_tables(model)
  local n, k = #entries, 0
  while k < n and tables[tensor.key(entries[k + 1].tensor)] do k = k + 1 end
  if k == 0 or k == n then return nil end
  local table_numel, rest_numel = 0, 0
  for i = 1, n do
    local numel = entries[i].tensor:numel()
    if i <= k then table_numel = table_numel + numel else rest_numel = rest_numel + numel end
  end
  local j, numel = k, 0
  while j < n and numel < table_numel and numel + entries[j + 1].tensor:numel() <= rest_numel / 2 do
    j = j + 1
    numel = numel + entries[j].tensor:numel()
  end
  if j == k then return nil end
  local order = {}
  for i = k, j - 1 do order[#order + 1] = i end
  for i = 0, k - 1 do order[#order + 1] = i end
  for i = j, n - 1 do order[#order + 1] = i end
  return order, j - k
end

-- The plan's blocks (plan.pipeline.blocks) of model in forward order, and their
-- parameters (key -> block number, from 1); nil when the plan names no blocks list.
function data.blocks(model, plan)
  local path = plan and plan.pipeline and plan.pipeline.blocks
  local blocks = path and model:get(path)
  if not blocks then return nil end
  local list, block_of = {}, {}
  for j, name in ipairs(blocks._child_names) do
    list[j] = blocks[name]
    for _, slot in ipairs(blocks[name]:param_slots()) do block_of[tensor.key(slot[3])] = j end
  end
  return list, block_of
end

-- ZeRO-3: the unit of every entry (0-based, in entries' order), the blocks in unit
-- order, each { module, unit }, and the blocks' parameters (key -> block number): the
-- parameters before the first block's are unit 0, each block's the next, those after
-- the last block's the last. nil and a message when entries do not go in that order.
function data.units(model, plan, entries)
  local list, block_of = data.blocks(model, plan)
  if not list then
    return nil, "parallel.zero_stage = 3 gathers parameters block by block: the model's " ..
                "plan names no blocks list (plan.pipeline.blocks, as recipes/llama/plan.lua's)"
  end
  local unit_of, order, unit, last_block, after = {}, {}, 0, 0, false
  for i, e in ipairs(entries) do
    local j = block_of[tensor.key(e.tensor)]
    if j then
      if after or j < last_block then
        return nil, ("parallel.zero_stage = 3: parameter %s of block %d comes after " ..
                     "parameters of a later block or of the head"):format(e.name or i, j)
      end
      if j ~= last_block then
        if i > 1 then unit = unit + 1 end
        last_block = j
        order[#order + 1] = { module = list[j], unit = unit }
      end
    elseif last_block > 0 and not after then
      after = true
      unit = unit + 1
    end
    unit_of[i] = unit
  end
  return unit_of, order, block_of
end

-- entries: par:placements()'s list (each .tensor a parameter to average); model: the
-- module they belong to (data.row_sparse, data.tail_order), or nil; plan: the model's
-- plan (ZeRO-3's blocks).
function data.wrap(entries, mesh, cfg, model, plan)
  cfg = cfg or {}
  local p, d = cfg.parallel or {}, cfg.dist or {}
  local group = mesh.cp.size > 1 and mesh.dpcp or mesh.dp
  local params = {}
  for i, e in ipairs(entries) do params[i] = e.tensor end
  local self = setmetatable({ params = params, mesh = mesh, group = group,
                              dp_rank = mesh.dp.rank, dp_size = mesh.dp.size,
                              zero_stage = p.zero_stage or 0, step = 0, deferred = 0,
                              exposed_comm_s = 0.0 }, DDP)
  if self.zero_stage ~= 0 and self.zero_stage ~= 1 and self.zero_stage ~= 2 and
     self.zero_stage ~= 3 then
    error("parallel.zero_stage = " .. tostring(self.zero_stage) ..
          ": only 0, 1, 2 and 3 are implemented", 2)
  end
  if group.size > 1 then
    local zero3 = self.zero_stage == 3
    local row_sparse = model and not zero3 and data.row_sparse(model, entries, cfg)
    local order, n_deferred, units, blocks, block_of
    if model and not zero3 then order, n_deferred = data.tail_order(model, entries, cfg) end
    if zero3 then
      units, blocks, block_of = data.units(model, plan, entries)
      if not units then error(blocks, 2) end
    end
    local unit_of = units and ffi.new("int[?]", #params, units) or nil
    -- ZeRO-3 in bf16 / fp16: the blocks' matrices, read only by the GEMMs through their
    -- low-precision copies, travel in that precision (half the bytes of f32).
    local precision = (cfg.train or {}).precision
    local gather_dtype = zero3 and (precision == "bf16" and C.TT_BF16 or
                                    precision == "fp16" and C.TT_F16) or C.TT_F32
    local lowp_flags
    if zero3 and gather_dtype ~= C.TT_F32 then
      local in_block = {}
      for _, b in ipairs(blocks) do in_block[b.unit] = true end
      local flags = {}
      for i, e in ipairs(entries) do
        flags[i] = (in_block[units[i]] and e.tensor.ndim == 2) and 1 or 0
      end
      lowp_flags = ffi.new("int[?]", #params, flags)
    end
    -- The arrays are locals: a struct's pointer fields do not keep them alive.
    local flags = row_sparse and ffi.new("int[?]", #params, row_sparse) or nil
    local tail = order and ffi.new("int[?]", #params, order) or nil
    local opts = ffi.new("tt_dist_reducer_opts", {
      bucket_mb = d.bucket_mb or 25.0, zero_stage = self.zero_stage, row_sparse = flags,
      tail_order = tail, n_deferred = n_deferred or 0, unit_of = unit_of,
      gather_dtype = gather_dtype, gather_lowp = lowp_flags })
    local box = ffi.new("tt_dist_reducer *[1]")
    check(C.tt_dist_reducer_new(group._c, tensor.tensor_array(params), #params, opts, box))
    self._reducer = ffi.gc(box[0], C.tt_dist_reducer_free)
    self.num_buckets = C.tt_dist_reducer_num_buckets(box[0])
    self.deferred = n_deferred or 0
    if zero3 then
      self.unit_of = units
      self:_shard_blocks(blocks, block_of)
    end
  end
  return self
end

local pbox = tensor.pout

-- ZeRO-3: every block's forward gathers its unit (and starts the next block's gather),
-- and between the identity ops unit_enter and unit_exit, so that backward gathers it
-- again; then the blocks' units are released. block_of: data.units' third result.
function DDP:_shard_blocks(blocks, block_of)
  local r = self._reducer
  self.released = block_of   -- key -> block: parameters held only while their block runs
  for j, b in ipairs(blocks) do
    local unit, block, run = b.unit, b.module, b.module.forward
    local next_fwd = blocks[j + 1] and blocks[j + 1].unit or -1
    local next_bwd = j > 1 and blocks[j - 1].unit or -1
    rawset(block, "forward", function(mod, x, ...)
      check(C.tt_dist_reducer_unit_gather(r, unit))
      check(C.tt_dist_reducer_unit_prefetch(r, next_fwd))
      if C.tt_is_grad_enabled() == 0 or x._requires_grad == 0 then
        local ok, y = pcall(run, mod, x, ...)
        check(C.tt_dist_reducer_unit_release(r, unit))
        if not ok then error(y, 0) end
        return y
      end
      local xin = tensor.take(C.tt_dist_reducer_unit_enter(r, unit, x, pbox))
      local y = run(mod, xin, ...)
      F.free(xin)
      local out = tensor.take(C.tt_dist_reducer_unit_exit(r, unit, next_bwd, y, pbox))
      F.free(y)
      return out
    end)
    check(C.tt_dist_reducer_unit_release(r, unit))
  end
  self.sharded_blocks = #blocks
end

-- ZeRO-3: all-gathers of units so far (each block twice per micro-batch, once per
-- forward and once per backward, plus the outside units after every step).
function DDP:unit_gathers()
  local r = self._reducer
  if not r then return 0, 0 end
  return tonumber(C.tt_dist_reducer_unit_gathers(r)),
         tonumber(C.tt_dist_reducer_unit_gather_bytes(r))
end

function DDP:begin_step()
  self.step = self.step + 1
  C.tt_dist_set_step(self.step)
end

-- Rows [r * B / dp, (r + 1) * B / dp) of a global batch (B, ...) for DP rank r: a view.
function DDP:batch_slice(t)
  if self.dp_size == 1 then return t end
  local rows = t:size(0)
  if rows % self.dp_size ~= 0 then
    error(string.format("global batch of %d rows does not divide by " ..
                        "parallel.data_parallel_size %d", rows, self.dp_size), 2)
  end
  local n = rows / self.dp_size
  return t:narrow(0, self.dp_rank * n, n)
end

-- Arms the reducer for the last micro-batch only: earlier micro-batches just accumulate.
function DDP:before_backward(is_last)
  if self._reducer then C.tt_dist_reducer_arm(self._reducer, is_last and 1 or 0) end
end

function DDP:finish_grads()
  if not self._reducer then return end
  check(C.tt_dist_reducer_finish(self._reducer))
  self.exposed_comm_s = C.tt_dist_reducer_exposed_s(self._reducer)
  self.sparse_rows = tonumber(C.tt_dist_reducer_sparse_rows(self._reducer))
  self.held = C.tt_dist_reducer_held(self._reducer)
end

-- Mean of a per-rank number over the reduction group (dp, or dp x cp under context
-- parallelism): the logged loss is the global mean.
function DDP:all_reduce_mean(x)
  return self.group:mean(x)
end

local zeros_like = require("tetra.optim").state_like   -- on the shard's device

-- ZeRO-1: the optimizer keeps state for this rank's shards only. Replaces opt.params
-- (and its moments) by the shard views; self.shards lists them as { tensor, param (index
-- into the params given to wrap, 1-based), offset (element offset into that flattened
-- parameter) }. Must run before the optimizer's first step. No-op without ZeRO-1.
function DDP:attach_optimizer(opt)
  if self.zero_stage == 0 or not self._reducer or self._opt == opt then return end
  if (opt.step_count or 0) > 0 then
    error("ddp:attach_optimizer: the optimizer has already stepped; attach it first", 2)
  end
  local r = self._reducer
  local shards, views, names, m, v = {}, {}, {}, {}, {}
  for i = 0, C.tt_dist_reducer_num_shards(r) - 1 do
    local s = tensor.borrow(C.tt_dist_reducer_shard(r, i))
    local param = C.tt_dist_reducer_shard_param(r, i) + 1
    shards[#shards + 1] = { tensor = s, param = param,
                            offset = tonumber(C.tt_dist_reducer_shard_offset(r, i)) }
    views[#views + 1] = s
    names[#names + 1] = (opt.names and opt.names[param] or "param") .. ".shard"
    m[#m + 1], v[#v + 1] = zeros_like(s), zeros_like(s)
  end
  self.shards = shards
  -- The whole-parameter moments the optimizer was built with are replaced by the
  -- shards': released now, not whenever the Lua GC gets to them (twice the parameters'
  -- bytes, counted in every step's peak until then).
  for _, list in ipairs({ opt.m or {}, opt.v or {} }) do
    for _, t in ipairs(list) do F.free(t) end
  end
  opt.params, opt.names, opt.m, opt.v = views, names, m, v
  opt:_build_groups()
  self._opt = opt
end

-- ZeRO-1: the part of `whole` (a tensor shaped like parameter shard.param) that shard
-- covers, as a view shaped like the shard.
local function shard_part(whole, shard)
  local flat = F.view(whole, { whole:numel() })
  local piece = F.narrow(flat, 0, shard.offset, shard.tensor:numel())
  local v = F.view(piece, shard.tensor:shape())
  F.free(piece); F.free(flat)
  return v
end

-- Optimizer offload under bf16 / fp16: what AdamW:masters_on_host needs to keep this
-- rank's shares of the f32 master weights on the host. ZeRO-1 and 2: the weight each
-- optimizer parameter is a share of, and the all-gather of the shares. ZeRO-3: the
-- reducer's own buffers are the shares; away() gives their device memory back (the
-- blocks' gathers send compute-dtype copies of them meanwhile), home() takes it again
-- for the caller to fill, bytes() says what went and what stayed (reducer.c). nil
-- otherwise.
function DDP:master_shares()
  if not (self.shards and self._reducer and self.zero_stage >= 1) then return nil end
  local r = self._reducer
  if self.zero_stage == 3 then
    local kept = ffi.new("int64_t[1]")
    return {
      away = function() check(C.tt_dist_reducer_shares_away(r)) end,
      home = function() check(C.tt_dist_reducer_shares_home(r)) end,
      bytes = function()
        local away = C.tt_dist_reducer_shares_away_bytes(r, kept)
        return tonumber(away), tonumber(kept[0])
      end }
  end
  local whole_of = {}
  for j, sh in ipairs(self.shards) do whole_of[j] = self.params[sh.param] end
  return { whole_of = whole_of,
           gather = function() check(C.tt_dist_reducer_gather_params(r)) end }
end

-- ZeRO-1: per-parameter tensors (index-aligned with the params given to wrap) put
-- together from this rank's per-shard ones (index-aligned with self.shards) and every
-- other rank's: f32 zeros beside each parameter, each shard copied into its range, then
-- summed over the group (collective), one parameter at a time. params: the parameters
-- (for the shapes). each(i, whole) (optional) takes parameter i's tensor as it is done, and
-- nothing is returned: then only one parameter's whole tensor is on the device at a time
-- (8 bytes a parameter on every GPU at once otherwise, which ZeRO is there to avoid). A
-- checkpoint gathers each tensor on its writer alone instead (gather_to_owners);
-- tests/dist/grad_check.lua compares whole tensors with this.
function DDP:gather_shards(per_shard, params, each)
  local mine = {}   -- parameter index -> this rank's shards of it
  for j, sh in ipairs(self.shards) do
    mine[sh.param] = mine[sh.param] or {}
    table.insert(mine[sh.param], j)
  end
  local whole = {}
  for i, p in ipairs(params) do
    local w = zeros_like(p)
    for _, j in ipairs(mine[i] or {}) do
      local dst = shard_part(w, self.shards[j])
      check(C.tt_copy_(dst, per_shard[j]))
      F.free(dst)
    end
    self.group:all_reduce(w, "sum")
    if each then each(i, w) else whole[i] = w end
  end
  return whole
end

-- ZeRO, for a checkpoint: parameter i's whole per-parameter tensor (a moment, or under
-- ZeRO-3 the parameter from the optimizer's shares) put together on
-- group rank owners[i] alone, from every rank's piece of it (per_shard, index-aligned
-- with self.shards), point to point: each rank sends its pieces once, about 1/dp of the
-- state in all, where gather_shards' all-reduce moved twice the whole state through every
-- rank and made it whole on every device. A parameter without an owner (owners[i] nil:
-- no rank of the group writes it) is not gathered. each(i, whole) runs on the owner, the
-- tensor on `device` (default: the parameter's). Collective over the group, in parameter
-- order.
local GATHER_TAG = 0x7a31
function DDP:gather_to_owners(per_shard, params, owners, each, device)
  local r, me = self._reducer, self.group.rank
  local mine = {}   -- parameter index -> this rank's shard of it (one at most)
  for j, sh in ipairs(self.shards) do mine[sh.param] = j end
  local off, len = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  local function flat(t, n)
    return F.view(t, { n or t:numel() })
  end
  for i, p in ipairs(params) do
    local o = owners[i]
    if o == me then
      local w = tensor.take(C.tt_tensor_lazy_zeros(p._shape, p._ndim, device or p._device,
                                                   tensor.pout))
      local whole = flat(w)
      for src = 0, self.group.size - 1 do
        if C.tt_dist_reducer_param_piece(r, i - 1, src, off, len) == 1 then
          local piece = F.narrow(whole, 0, off[0], len[0])
          if src == me then
            local s = flat(per_shard[mine[i]])
            check(C.tt_copy_(piece, s))
            F.free(s)
          else
            self.group:recv(piece, src, GATHER_TAG)
          end
          F.free(piece)
        end
      end
      F.free(whole)
      each(i, w)
    elseif o ~= nil and mine[i] then
      local s = flat(per_shard[mine[i]])
      self.group:send(s, o, GATHER_TAG)
      F.free(s)
    end
  end
end

-- One optimizer update; with ZeRO-1 each rank updates its shards and the updated
-- parameters are all-gathered.
-- With master weights on the host (AdamW:masters_on_host under stage 1 or 2) the
-- optimizer's whole_masters first gives the released weights their memory back.
function DDP:optimizer_step(opt, lr)
  if self.zero_stage >= 1 and self._reducer then
    self:attach_optimizer(opt)
    opt:step(lr)
    if opt._gather_masters then opt:whole_masters(true)
    else check(C.tt_dist_reducer_gather_params(self._reducer)) end
  else
    opt:step(lr)
  end
end

return data
