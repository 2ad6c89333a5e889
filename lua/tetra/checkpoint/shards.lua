-- tetra.checkpoint.shards: which slices of the parameters and their optimizer moments this
-- rank saves, the index.json that says where each slice went, and the load that puts
-- this rank's slices together again from whatever layout wrote them (a reshard).
local ffi = require("ffi")
local C = require("tetra.ffi").C
local check = require("tetra.ffi").check
local F = require("tetra.nn.functional")
local T = require("tetra.tensor")
local fs = require("tetra.util.fs")
local json = require("tetra.util.json")
local fail = require("tetra.util.errors").raise
local folder = require("tetra.checkpoint.dir")

local M = {}

-- -- This rank's slices ----------------------------------------------------------------------

-- ZeRO-1 across ranks: each rank's optimizer holds only its shards.
function M.zero_sharded(env)
  return env.ddp.shards ~= nil
end

-- The kinds of optimizer state per parameter: { prefix, list } pairs (the lists follow
-- opt.params).
local function state_kinds(opt)
  if opt.m then return { { "m", opt.m }, { "v", opt.v } } end
  return { { "momentum", opt.buffers } }
end

-- The writers of slices (written_here's data-parallel ranks, nil: none) as ranks of the
-- ZeRO group, which under context parallelism spans dp x cp (the writer of a slice is
-- the one of context-parallel rank 0).
local function group_ranks(env, group, owners, n)
  if group == env.mesh.dp then return owners end
  local c, of_world = env.mesh.coords, {}
  for g = 0, group.size - 1 do of_world[group:world_rank(g)] = g end
  local out = {}
  for i = 1, n do
    if owners[i] then
      out[i] = of_world[env.mesh:rank_at({ tp = c.tp, cp = 0, dp = owners[i], pp = c.pp })]
    end
  end
  return out
end

-- This rank's parameters as an array of { name =, tensor =, shape = the whole
-- parameter's shape, dim =, offset =, length = (the 0-based dim and the range of it the
-- tensor holds), primary =, state = { m = tensor, v = tensor } (or momentum) }, from
-- their placements. Under ZeRO each slice's moments, and under ZeRO-3 its parameter too,
-- are put together from every rank's shard on the rank that writes the slice alone
-- (DDP:gather_to_owners, point to point, one parameter on the device at a time), and kept
-- on the host; elsewhere that slice's tensor is nil. Without ZeRO they are the
-- optimizer's own tensors and the parameters. `own` names the fields that hold private
-- host copies (the asynchronous writer takes them as they are).
function M.local_slices(env)
  local opt, entries, ddp = env.optimizer, env.par:placements(), env.ddp
  local out, params = {}, {}
  for i, e in ipairs(entries) do
    local pl = e.placement
    out[i] = { name = pl.name, tensor = e.tensor, shape = pl.shape, dim = pl.dim,
               offset = pl.offset, length = pl.length, primary = pl.primary, state = {},
               own = {} }
    params[i] = e.tensor   -- for the shapes and the device
  end
  local mine, owners = M.written_here(env, out)
  out.written_here = mine
  if not M.zero_sharded(env) then
    for _, kind in ipairs(state_kinds(opt)) do
      for i, t in ipairs(kind[2]) do out[i].state[kind[1]] = t end
    end
    return out
  end
  owners = group_ranks(env, ddp.group, owners, #entries)
  if ddp.zero_stage == 3 then
    -- The parameters are shares too (the optimizer's, f32): a unit is never gathered
    -- whole for a save (every rank took the whole model in before, unit by unit).
    if opt.whole_masters then opt:whole_masters() end   -- offloaded shares come home
    for _, e in ipairs(out) do e.tensor = nil end
    ddp:gather_to_owners(opt.params, params, owners, function(i, w)
      out[i].tensor, out[i].own.tensor = T.moved(w, C.TT_CPU), true
    end)
  end
  for _, kind in ipairs(state_kinds(opt)) do
    ddp:gather_to_owners(kind[2], params, owners, function(i, w)
      out[i].state[kind[1]], out[i].own[kind[1]] = T.moved(w, C.TT_CPU), true
    end, opt.offloaded and C.TT_CPU or nil)
  end
  return out
end

-- A copy of t in host memory that nothing else references.
function M.host_copy(t)
  if t._device == C.TT_CPU then return t:clone() end
  return T.take(C.tt_to_device(t, C.TT_CPU, T.pout))
end


-- The { name, tensor, own } entries of model.safetensors or optim.safetensors from slices
-- (own: the tensor is a private host copy, see M.local_slices).
function M.model_entries(slices)
  local out = {}
  for _, e in ipairs(slices) do out[#out + 1] = { e.name, e.tensor, e.own.tensor } end
  return out
end

function M.optim_entries(slices)
  local out = {}
  for _, e in ipairs(slices) do
    for _, prefix in ipairs({ "m", "v", "momentum" }) do
      if e.state[prefix] then
        out[#out + 1] = { prefix .. "." .. e.name, e.state[prefix], e.own[prefix] }
      end
    end
  end
  return out
end

-- -- Saving shards (tensor, pipeline, context parallelism, ZeRO) ---------------------------

local function group_rank(g) return g and g.rank or 0 end
local function group_size(g) return g and g.size or 1 end

-- Whether the checkpoint is written in shards, with index.json: parameters split over
-- ranks (tensor, pipeline parallelism), held by several ranks of one model replica
-- (context parallelism), or by several data-parallel ranks, which then share the writing
-- (M.written_here; under ZeRO each holds a share of the state, without it every one
-- holds it all).
function M.split_layout(env)
  local l = env.par.layout
  return l.tp > 1 or l.pp > 1 or l.cp > 1 or group_size(env.mesh.dp) > 1
end

-- Items of sizes numel[i] (the indices in `order`) dealt to n ranks, the largest first to
-- the one with the fewest elements so far (ties: the lower rank, then the lower index),
-- the same on every rank: owner[i], the 0-based rank.
local function deal(numel, order, n)
  order = { unpack(order) }
  table.sort(order, function(a, b)
    if numel[a] ~= numel[b] then return numel[a] > numel[b] end
    return a < b
  end)
  local owner, load = {}, {}
  for r = 0, n - 1 do load[r] = 0 end
  for _, i in ipairs(order) do
    local best = 0
    for r = 1, n - 1 do if load[r] < load[best] then best = r end end
    owner[i], load[best] = best, load[best] + numel[i]
  end
  return owner
end

-- For each slice (index-aligned with slices), whether this rank writes it and its
-- optimizer state. A whole checkpoint: rank 0 all. A split one: the slices this rank
-- counts (primary), by context-parallel rank 0, the data-parallel ranks sharing them
-- (dealt by elements): each writes 1/dp of the state, and the files are written in
-- parallel. Under ZeRO each keeps on the host only what it writes (12 bytes a parameter
-- in all: 840 GB for a 70B model under ZeRO-3 on data parallelism alone, where one rank
-- held it all); without it every rank holds the whole state, and 1/dp of the writing
-- falls to each (Megatron-LM's fully parallel save). Also returns, per slice, the
-- data-parallel rank that writes it, with context-parallel rank 0 (nil: none).
function M.written_here(env, slices)
  local mine, owners = {}, {}
  if not M.split_layout(env) then
    for i = 1, #slices do mine[i], owners[i] = (env.rank or 0) == 0, 0 end
    return mine, owners
  end
  local numel, order = {}, {}
  for i, e in ipairs(slices) do
    numel[i] = e.tensor:numel()
    if e.primary then order[#order + 1] = i end
  end
  local owner = deal(numel, order, group_size(env.mesh.dp))
  local here = group_rank(env.mesh.cp) == 0
  for i, e in ipairs(slices) do
    owners[i] = e.primary and owner[i] or nil   -- of context-parallel rank 0
    mine[i] = here and owners[i] == group_rank(env.mesh.dp)
  end
  return mine, owners
end

local function shard_name(rank) return string.format("shard_%05d.safetensors", rank) end

-- This rank's shard file and its part of the index (shard_NNNNN.json, merged into
-- index.json by rank 0), appended to `files` (see tetra.checkpoint.save's plan) when
-- this rank writes one.
function M.shard_files(env, slices, rank, meta, files)
  local mine, any = slices.written_here, false
  for i = 1, #slices do any = any or mine[i] end
  if not any then return end
  local file = shard_name(rank)
  local entries, index = {}, {}
  for i, e in ipairs(slices) do
    if mine[i] then
      local list = { { e.name, e.tensor, e.own.tensor } }
      for _, kt in ipairs(M.optim_entries({ e })) do list[#list + 1] = kt end
      for _, kt in ipairs(list) do
        entries[#entries + 1] = kt
        index[kt[1]] = { shape = e.shape, shards = { { file = file, dim = e.dim,
                                                       offset = e.offset, length = e.length } } }
      end
    end
  end
  files[#files + 1] = { name = file, tensors = entries, meta = meta, summed = true }
  files[#files + 1] = { name = string.format("shard_%05d.json", rank),
                        bytes = json.encode(index) .. "\n" }
end

-- Rank 0, once every rank wrote: the text of index.json, merged from the
-- shard_NNNNN.json parts in tmp (which it removes).
function M.merge_index(tmp)
  local parts = {}
  for _, e in ipairs(fs.listdir(tmp) or {}) do
    if e:match("^shard_%d+%.json$") then parts[#parts + 1] = e end
  end
  table.sort(parts)
  local tensors = {}
  for _, part in ipairs(parts) do
    local text = fs.read_file(tmp .. "/" .. part)
    for key, entry in pairs(json.decode(text)) do
      local have = tensors[key]
      if not have then
        tensors[key] = entry
      else
        for _, s in ipairs(entry.shards) do have.shards[#have.shards + 1] = s end
      end
    end
    local ok, err = os.remove(tmp .. "/" .. part)
    if not ok then fail("checkpoint: cannot remove %s: %s", part, tostring(err)) end
  end
  return json.encode({ format = 1, tensors = tensors }) .. "\n"
end

-- -- The index of a checkpoint ---------------------------------------------------------------

local function count(v) return type(v) == "number" and v >= 0 and v == math.floor(v) and v < 2^53 end

-- What is wrong with an index.json entry ({ shape =, shards = { { file =, dim =, offset =,
-- length = } } }), or nil.
local function index_entry_problem(entry)
  if type(entry) ~= "table" or type(entry.shape) ~= "table" or type(entry.shards) ~= "table" then
    return "no shape or shards"
  end
  for _, n in ipairs(entry.shape) do
    if not count(n) then return "a bad size in its shape" end
  end
  if #entry.shape == 0 then return "an empty shape" end
  for _, sh in ipairs(entry.shards) do
    if type(sh) ~= "table" or type(sh.file) ~= "string" or not sh.file:match("^[%w_.-]+$") then
      return "a shard without a file name"
    end
    if not (count(sh.dim) and count(sh.offset) and count(sh.length)) or sh.dim >= #entry.shape or
       sh.offset + sh.length > entry.shape[sh.dim + 1] then
      return "a shard whose dim, offset or length does not fit the shape"
    end
  end
end

-- The tensors of checkpoint `path` as index.json lists them: { NAME = { shape =,
-- shards = {...} } }; for a checkpoint written whole by rank 0 (no index.json), one
-- whole-tensor shard per entry of model.safetensors and optim.safetensors.
function M.load_index(path)
  local text = fs.read_file(path .. "/index.json")
  if text then
    folder.verify(path .. "/index.json")
    local ok, idx = pcall(json.decode, text)
    if not ok or type(idx) ~= "table" or type(idx.tensors) ~= "table" then
      fail("checkpoint: %s/index.json is corrupt (%s)", path, ok and "no tensors" or tostring(idx))
    end
    for name, entry in pairs(idx.tensors) do
      local why = index_entry_problem(entry)
      if why then fail("checkpoint: %s/index.json is corrupt (tensor '%s': %s)", path, tostring(name), why) end
    end
    return idx.tensors
  end
  local tensors = {}
  for _, file in ipairs({ "model.safetensors", "optim.safetensors" }) do
    -- A weights-only checkpoint (state.json's weights_only) has no optim.safetensors.
    if file == "model.safetensors" or fs.exists(path .. "/" .. file) then
      local f = folder.open_safetensors(path .. "/" .. file)
      for _, name in ipairs(f:names()) do
        local shape = f:info(name).shape
        tensors[name] = { shape = shape, shards = { { file = file, dim = 0, offset = 0,
                                                      length = shape[1] } } }
      end
      f:close()
    end
  end
  return tensors
end

-- -- Putting a slice together ----------------------------------------------------------------

local function shape_text(s) return "[" .. table.concat(s, ", ") .. "]" end

-- The box { lo = {...}, hi = {...} } (per dim, 0-based bounds) that a tensor of the whole
-- shape `shape` holding [offset, offset + length) of `dim` covers.
local function box(shape, dim, offset, length)
  local lo, hi = {}, {}
  for d = 1, #shape do lo[d], hi[d] = 0, shape[d] end
  lo[dim + 1], hi[dim + 1] = offset, offset + length
  return { lo = lo, hi = hi }
end

-- t narrowed to [lo - base.lo, hi - base.lo) in every dim (a view; t itself when whole).
local function sub(t, base, lo, hi)
  local v = t
  for d = 1, #lo do
    if lo[d] ~= base.lo[d] or hi[d] ~= base.hi[d] then
      local n = F.narrow(v, d - 1, lo[d] - base.lo[d], hi[d] - lo[d])
      if v ~= t then F.free(v) end
      v = n
    end
  end
  return v
end

-- Reads the box [lo, hi) of a shard into `to` where the file's tensor `name` holds the
-- shard as a part of another tensor (a Hugging Face folder's, tetra.checkpoint.hf's
-- sliced_index): its rows from s.at (0 by default) of the file tensor's first dim, or with
-- s.transposed, its columns from s.at of a 2-D file tensor that holds it transposed (GPT-2's
-- Conv1D weights are (in, out), and c_attn's are q, k and v side by side). Only the box
-- is read, in the file's coordinates, then transposed into place. claimed: the shard's
-- shape; stored: the file tensor's.
local function read_part(f, file, name, s, claimed, stored, lo, hi, to)
  local at, fits = s.at or 0, #stored == #claimed
  if s.transposed then
    fits = fits and #claimed == 2 and stored[1] == claimed[2] and at + claimed[1] <= stored[2]
  else
    fits = fits and at + claimed[1] <= stored[1]
    for d = 2, #claimed do fits = fits and stored[d] == claimed[d] end
  end
  if not fits then
    fail("checkpoint %s: tensor '%s' has shape %s in the file, which does not hold %s%s " ..
         "from %d", file, name, shape_text(stored), shape_text(claimed),
         s.transposed and " transposed" or "", at)
  end
  if not s.transposed then
    local flo, fhi = {}, {}
    for d = 1, #lo do flo[d], fhi[d] = lo[d], hi[d] end
    flo[1], fhi[1] = at + lo[1], at + hi[1]
    return folder.read_box(f, name, flo, fhi, to)
  end
  local part = T.take(C.tt_tensor_empty(ffi.new("int64_t[2]", hi[2] - lo[2], hi[1] - lo[1]), 2,
                                        to._dtype, C.TT_CPU, T.pout))
  folder.read_box(f, name, { lo[2], at + lo[1] }, { hi[2], at + hi[1] }, part)
  local back = part:transpose(0, 1)
  check(C.tt_copy_(to, back))
  F.free(back)
  F.free(part)
end

-- Fills t, the box `want` ({ lo =, hi = }, see box) of checkpoint tensor `key` (whose
-- whole shape the model says is `shape`), from the shards that hold parts of it, reading
-- only the parts of their files that it covers. files: path -> open file (a cache the
-- caller closes).
local function fill_box(path, tensors, files, key, shape, want, t)
  local entry = tensors[key]
  if not entry then fail("checkpoint %s has no tensor '%s' (the model has it)", path, key) end
  if shape_text(entry.shape) ~= shape_text(shape) then
    fail("checkpoint %s: tensor '%s' has shape %s in the checkpoint but %s in the model",
         path, key, shape_text(entry.shape), shape_text(shape))
  end
  local covered, needed = 0, 1
  for d = 1, #shape do needed = needed * (want.hi[d] - want.lo[d]) end
  for _, s in ipairs(entry.shards) do
    local have = box(entry.shape, s.dim, s.offset, s.length)
    local lo, hi, n = {}, {}, 1
    for d = 1, #shape do
      lo[d] = math.max(want.lo[d], have.lo[d])
      hi[d] = math.min(want.hi[d], have.hi[d])
      n = n * math.max(0, hi[d] - lo[d])
    end
    if n > 0 then
      local file = path .. "/" .. s.file
      files[file] = files[file] or folder.open_safetensors(file)
      local f, name = files[file], s.name or key   -- name: the file's own (Hugging Face)
      if not f:has(name) then
        fail("checkpoint %s: cannot read tensor '%s': the file has no such tensor", file, name)
      end
      local stored, claimed = f:info(name).shape, {}
      for d = 1, #entry.shape do claimed[d] = have.hi[d] - have.lo[d] end
      local part = s.name and (s.transposed or s.at)
      if not part and shape_text(stored) ~= shape_text(claimed) then
        fail("checkpoint %s: tensor '%s' has shape %s in the file but %s in index.json", file,
             key, shape_text(stored), shape_text(claimed))
      end
      local from_lo, from_hi = {}, {}
      for d = 1, #shape do from_lo[d], from_hi[d] = lo[d] - have.lo[d], hi[d] - have.lo[d] end
      local to = sub(t, want, lo, hi)
      if part then
        read_part(f, file, name, s, claimed, stored, from_lo, from_hi, to)
      else
        folder.read_box(f, name, from_lo, from_hi, to)
      end
      if to ~= t then F.free(to) end
      covered = covered + n
    end
  end
  if covered ~= needed then
    fail("checkpoint %s: the shards of tensor '%s' do not cover this rank's part of it",
         path, key)
  end
end

-- Fills t, the slice e (see M.local_slices) of checkpoint tensor `key`.
function M.assemble(path, tensors, files, key, e, t)
  fill_box(path, tensors, files, key, e.shape, box(e.shape, e.dim, e.offset, e.length), t)
end

-- The boxes (0-based { lo =, hi = } per dim) that elements [first, last) of a row-major
-- tensor of `shape` make, in order, each contiguous: at most 2 x dims - 1.
local function flat_boxes(shape, first, last, out, prefix)
  out, prefix = out or {}, prefix or {}
  if first >= last then return out end
  local d = #prefix + 1
  local inner = 1
  for k = d + 1, #shape do inner = inner * shape[k] end
  local function add(r0, r1)   -- rows [r0, r1) of dim d, whole below it
    local lo, hi = {}, {}
    for k = 1, #prefix do lo[k], hi[k] = prefix[k], prefix[k] + 1 end
    lo[d], hi[d] = r0, r1
    for k = d + 1, #shape do lo[k], hi[k] = 0, shape[k] end
    out[#out + 1] = { lo = lo, hi = hi }
  end
  local function within(r, a, b)   -- elements [a, b) of row r of dim d
    local p = { unpack(prefix) }
    p[d] = r
    flat_boxes(shape, a, b, out, p)
  end
  local r0, r1 = math.floor(first / inner), math.floor(last / inner)
  if r0 == r1 then
    within(r0, first - r0 * inner, last - r0 * inner)
    return out
  end
  if first % inner ~= 0 then
    within(r0, first - r0 * inner, inner)
    r0 = r0 + 1
  end
  if r1 > r0 then add(r0, r1) end
  if last % inner ~= 0 then within(r1, 0, last - r1 * inner) end
  return out
end
M.flat_boxes = flat_boxes

-- Fills dst (numel n) with elements [first, first + n) of the slice e of checkpoint
-- tensor `key`, flattened in row-major order (a ZeRO shard of the parameter this rank
-- holds), reading only those.
local function fill_flat(path, tensors, files, key, e, first, dst)
  local n = dst:numel()
  local local_shape = {}
  for d = 1, #e.shape do local_shape[d] = d == e.dim + 1 and e.length or e.shape[d] end
  local flat = F.view(dst, { n })
  local at = 0
  for _, b in ipairs(flat_boxes(local_shape, first, first + n)) do
    local count, size = 1, {}
    for d = 1, #b.lo do size[d] = b.hi[d] - b.lo[d]; count = count * size[d] end
    b.lo[e.dim + 1], b.hi[e.dim + 1] = b.lo[e.dim + 1] + e.offset, b.hi[e.dim + 1] + e.offset
    local piece = F.narrow(flat, 0, at, count)
    local shaped = F.view(piece, size)
    fill_box(path, tensors, files, key, e.shape, b, shaped)
    F.free(shaped); F.free(piece)
    at = at + count
  end
  F.free(flat)
end

-- Fails when tensor t (parameter `name`, or a part of it) holds NaN or Inf.
local function check_finite(path, name, t)
  local total = T.sum(t)   -- NaN or Inf anywhere makes the sum so
  local v = total:item()
  F.free(total)
  if v ~= v or v == math.huge or v == -math.huge then
    fail("checkpoint %s: parameter '%s' holds NaN or Inf values (a corrupt or diverged " ..
         "checkpoint); resume from an earlier one", path, name)
  end
end

-- -- Loading ---------------------------------------------------------------------------------

-- Under ZeRO: each of this rank's shards of the parameters and of their moments read
-- from its range of the checkpoint's tensors, and nothing else (a rank reads 1/dp of
-- the parameters and the moments, where it read them all); then the parameters made
-- whole again from every rank's shards, as after an update (collective over the
-- group). ZeRO-3: the reducer's shares are the shards; the gather refreshes the units
-- kept gathered.
local function load_shards(env, path, tensors, files, kinds)
  local opt, ddp, entries = env.optimizer, env.ddp, env.par:placements()
  if opt.whole_masters then opt:whole_masters() end   -- host masters: weights whole first
  T.no_grad(function()
    for j, sh in ipairs(ddp.shards) do
      local pl = entries[sh.param].placement
      fill_flat(path, tensors, files, pl.name, pl, sh.offset, opt.params[j])
      check_finite(path, pl.name, opt.params[j])
      for _, kind in ipairs(kinds) do
        fill_flat(path, tensors, files, kind[1] .. "." .. pl.name, pl, sh.offset, kind[2][j])
      end
    end
  end)
  check(C.tt_dist_reducer_gather_params(ddp._reducer))
end

-- Without ZeRO, where every rank of the data-parallel group (dp x cp under context
-- parallelism) holds the same slices: each slice, its parameter and its moments, read by
-- one rank of the group (dealt by elements, as a save shares the writing) and broadcast
-- from it to the others, so that the group reads the checkpoint once between them, where
-- each rank read its part whole (Megatron-LM's fully parallel load). The reads of the
-- next slices go on while the broadcasts of the last ones travel, up to IN_FLIGHT of
-- them at once. One process, or a group of one: each slice read here.
local IN_FLIGHT = 16
local function load_replicated(env, path, tensors, files, kinds)
  local entries, group = env.par:placements(), env.ddp and env.ddp.group
  local n = group and group.size or 1
  local numel, order = {}, {}
  for i, e in ipairs(entries) do numel[i], order[i] = e.tensor:numel(), i end
  local owner = deal(numel, order, n)
  local me = n > 1 and group.rank or 0
  local pending, waited = {}, 1
  local function land(h)
    local t = h:wait()
    C.tt_tensor_bump_version(t)   -- a write the engine did not see (cached low-precision copies)
  end
  T.no_grad(function()
    for i, e in ipairs(entries) do
      local pl, list = e.placement, { e.tensor }
      for _, kind in ipairs(kinds) do list[#list + 1] = kind[2][i] end
      if owner[i] == me then
        M.assemble(path, tensors, files, pl.name, pl, e.tensor)
        check_finite(path, pl.name, e.tensor)
        for k, kind in ipairs(kinds) do
          M.assemble(path, tensors, files, kind[1] .. "." .. pl.name, pl, list[k + 1])
        end
      end
      if n > 1 then
        for _, t in ipairs(list) do
          pending[#pending + 1] = group:broadcast_async(t, owner[i])
          if #pending - waited + 1 > IN_FLIGHT then land(pending[waited]); waited = waited + 1 end
        end
      end
    end
    for k = waited, #pending do land(pending[k]) end
  end)
end

-- Loads this rank's parameters and optimizer state, in its own layout, from the shards
-- (or the whole tensors) of checkpoint `path`, whatever layout wrote them, reading only
-- the parts of the files it needs (tetra.checkpoint.dir verifies those bytes' blocks).
-- params_only: the parameters alone (model.init_from), the checkpoint's moments, if any,
-- left; tensors: the index to read by (a Hugging Face folder's), else index.json's.
-- Returns the bytes this process read from the files meanwhile: { copied =,
-- summed = }.
local io_box = ffi.new("uint64_t[2]")
local function io_bytes()
  C.tt_io_bytes(io_box, io_box + 1)
  return tonumber(io_box[0]), tonumber(io_box[1])
end

function M.load_state(env, path, params_only, tensors)
  local copied, summed = io_bytes()
  local opt, files = env.optimizer, {}
  tensors = tensors or M.load_index(path)
  local kinds = params_only and {} or state_kinds(opt)
  local entries = env.par:placements()
  if env.par.layout.pp == 1 then   -- every parameter of the model is on this rank
    local known = {}
    for _, e in ipairs(entries) do
      known[e.placement.name] = true
      for _, kind in ipairs(kinds) do known[kind[1] .. "." .. e.placement.name] = true end
    end
    for name in pairs(tensors) do
      local moment = params_only and (name:match("^m%.") or name:match("^v%.") or
                                      name:match("^momentum%."))
      if not known[name] and not moment then
        fail("checkpoint %s: tensor '%s' is not in the model or its optimizer state (a " ..
             "different model or optimizer?)", path, name)
      end
    end
  end
  local ok, err = pcall(function()
    if M.zero_sharded(env) then return load_shards(env, path, tensors, files, kinds) end
    load_replicated(env, path, tensors, files, kinds)
  end)
  for _, f in pairs(files) do f:close() end
  if not ok then error(err, 0) end
  local copied_now, summed_now = io_bytes()
  return { copied = copied_now - copied, summed = summed_now - summed }
end

return M
