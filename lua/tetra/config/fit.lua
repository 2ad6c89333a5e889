-- tetra.config.fit: whether a run's layout fits its device's memory, asked by `tetra run`
-- before the recipe builds the model, and what to change when it does not.
--
-- The estimate is the planner's (tetra.planner: parameters, gradients, optimizer state,
-- activations and communication buffers of the largest rank, each rounded to the caching
-- allocator's size class); the memory is train.device_memory_gib when set, else the
-- device's own: a GPU's total memory, or on the CPU this host's available memory
-- (MemAvailable) shared by the ranks mpirun started on it. The advice is the change with
-- the shortest predicted step among those that fit on the same ranks: activation
-- recompute (selective, full), a higher ZeRO stage, more pipeline stages (fewer
-- data-parallel replicas), smaller micro-batches (more accumulation), optimizer offload
-- (on a GPU), and their combinations.
--
--   fit.check(cfg, world)          -- raises one config error line when it does not fit
--   fit.advice(cfg, world)         -- "the cheapest change that fits: --set ..." or nil
--   fit.out_of_memory(msg, cfg, world)  -- an allocator failure with that advice added
local ffi = require("ffi")
local errors = require("tetra.util.errors")
local models = require("tetra.models")

local M = {}

local GIB = 2 ^ 30

-- Bytes as GiB with three significant digits ("97.3", "0.282").
local function gib(bytes)
  local x = bytes / GIB
  return ("%." .. (x >= 100 and 0 or x >= 10 and 1 or x >= 1 and 2 or 3) .. "f"):format(x)
end

-- This host's ranks under mpirun (1 outside it).
local function local_ranks()
  for _, var in ipairs({ "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE" }) do
    local v = tonumber(os.getenv(var) or "")
    if v and v > 0 then return v end
  end
  return 1
end

-- Bytes /proc/meminfo gives for `key` (kB there), nil where there is no such file.
local function meminfo(key)
  local f = io.open("/proc/meminfo", "r")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  local kb = tonumber(text:match(key .. ":%s*(%d+)"))
  return kb and kb * 1024
end

-- The memory one rank may use, in bytes, and where that figure comes from (words for the
-- message); nil when it cannot be known.
function M.device_memory(cfg)
  local t = cfg.train
  if t.device_memory_gib and t.device_memory_gib > 0 then
    return t.device_memory_gib * GIB, ("the %s GiB of train.device_memory_gib"):format(
      gib(t.device_memory_gib * GIB))
  end
  local dev = tostring(t.device or "cpu")
  if dev:match("^cuda") then
    local C = require("tetra.ffi").C
    local id = require("tetra.device").start(dev)
    local free, total = ffi.new("size_t[1]"), ffi.new("size_t[1]")
    if C.tt_cuda_mem_info(id, free, total) ~= 0 then
      errors.raise("%s", ffi.string(C.tt_last_error()))
    end
    local bytes = tonumber(total[0])
    return bytes, ("the %s GiB of %s"):format(gib(bytes), dev)
  end
  local avail, n = meminfo("MemAvailable"), local_ranks()
  if not avail then return nil end
  return avail / n, n > 1 and
    ("this host's %s GiB of available memory shared by its %d ranks"):format(gib(avail), n) or
    ("this host's %s GiB of available memory"):format(gib(avail))
end

-- The planner's cluster for cfg's device, sized to `world` ranks: its rates only rank the
-- candidate changes; the memory sums depend on the precision alone.
local function cluster_for(cfg, world, mem_bytes)
  local planner = require("tetra.planner")
  local gpu = tostring(cfg.train.device):match("^cuda") ~= nil
  local per_node = math.min(local_ranks(), world)
  while world % per_node ~= 0 do per_node = per_node - 1 end
  return planner.cluster(gpu and "h100" or "cpu", {
    devices_per_node = per_node, nodes = world / per_node, precision = cfg.train.precision,
    mem_bytes = mem_bytes or math.huge })
end

-- Whether the planner can price cfg's model: a family of recipes/ with its presets'
-- parameter list and a plan (a model a recipe defines in its own code is not one).
local function priced(cfg)
  local m = cfg.model
  if not (m and m.dim and m.n_layers and m.n_heads and m.vocab_size and m.seq_len) then return false end
  local ok, fam = pcall(models.of, m)
  return ok and fam and type(fam.parameters) == "function"
end

-- The planner's record of cfg's own layout on `world` ranks.
function M.estimate(cfg, world, mem_bytes)
  local planner = require("tetra.planner")
  return planner.evaluate(cfg, planner.layout_of(cfg), cluster_for(cfg, world, mem_bytes))
end

-- n's divisors, largest first.
local function divisors_below(n)
  local up, out = require("tetra.planner.layouts").divisors(n), {}
  for i = #up, 1, -1 do out[#out + 1] = up[i] end
  return out
end

-- Every layout one change (or a combination) away from cfg's on the same ranks:
-- selective or full recompute, each higher ZeRO stage, pipeline stages times k with data
-- parallelism divided by k, each smaller micro-batch, offload on a GPU.
local function candidates(cfg, world)
  local planner = require("tetra.planner")
  local rules = require("tetra.parallel.layout")
  local base = planner.layout_of(cfg)
  local out = {}
  local rcs = base.recompute == "none" and { "none", "selective", "full" } or
              base.recompute == "selective" and { "selective", "full" } or { base.recompute }
  local zeros = {}
  for z = base.zero, 3 do zeros[#zeros + 1] = z end
  local pps = {}
  for _, k in ipairs(divisors_below(base.dp)) do
    local pp = base.pp * (base.dp / k)
    if pp <= cfg.model.n_layers then pps[#pps + 1] = { pp = pp, dp = k } end
  end
  -- Offload frees device memory only where the device is not the host.
  local offs = { base.offload or false }
  if not base.offload and tostring(cfg.train.device):match("^cuda") then offs[2] = true end
  for _, off in ipairs(offs) do
  for _, rc in ipairs(rcs) do
    for _, z in ipairs(zeros) do
      for _, pd in ipairs(pps) do
        local rows = cfg.train.batch_size / pd.dp
        for _, mb in ipairs(divisors_below(rows)) do
          if mb <= base.micro_batch then
            local lay = {}
            for k, v in pairs(base) do lay[k] = v end
            lay.recompute, lay.zero, lay.pp, lay.dp, lay.micro_batch = rc, z, pd.pp, pd.dp, mb
            lay.offload = off
            if pd.pp == 1 then lay.v, lay.schedule = 1, "1f1b" end
            if lay.pp > 1 and lay.schedule == "interleaved_1f1b" and
               (cfg.model.n_layers / lay.pp) % lay.v ~= 0 then
              lay.v, lay.schedule = 1, "1f1b"
            end
            if lay.dp * lay.cp == 1 then lay.zero = 0 end
            local changed = lay.recompute ~= base.recompute or lay.zero ~= base.zero or
                            lay.pp ~= base.pp or lay.micro_batch ~= base.micro_batch or
                            lay.offload ~= (base.offload or false)
            if changed and #rules.problems(planner.with_layout(cfg, lay), world) == 0 then
              out[#out + 1] = lay
            end
          end
        end
      end
    end
  end
  end
  return out
end

-- The --set settings that differ between records a (the run's) and b.
local function change_of(a, b)
  local planner = require("tetra.planner")
  local have, sets = {}, {}
  for _, s in ipairs(planner.settings(a)) do have[s] = true end
  for _, s in ipairs(planner.settings(b)) do
    if not have[s] then sets[#sets + 1] = "--set " .. s end
  end
  if (a.recompute or "none") ~= "none" and (b.recompute or "none") == "none" then
    sets[#sets + 1] = "--set train.recompute=none"
  end
  return table.concat(sets, " ")
end

-- The fitting change with the shortest predicted step: its record and --set text, or nil.
function M.cheapest(cfg, world, mem_bytes, current)
  local planner = require("tetra.planner")
  local cl = cluster_for(cfg, world, mem_bytes)
  current = current or planner.evaluate(cfg, planner.layout_of(cfg), cl)
  -- Shortest step first; within 0.5% of it, the smallest change (fewest settings), then
  -- the one that keeps the most memory in use (the least accumulation or recompute).
  local best, best_n
  for _, lay in ipairs(candidates(cfg, world)) do
    local r = planner.evaluate(cfg, lay, cl)
    if r.mem.total <= mem_bytes then
      local _, n = change_of(current, r):gsub("%-%-set", "")
      local better = not best or r.step_s < best.step_s * 0.995 or
        (r.step_s <= best.step_s * 1.005 and
         (n < best_n or (n == best_n and r.mem.total > best.mem.total)))
      if better then best, best_n = r, n end
    end
  end
  if not best then return nil end
  return best, change_of(current, best)
end

local function describe(r)
  local m = r.mem
  return ("parameters %s, gradients %s, optimizer %s, activations %s, buffers %s GiB"):format(
    gib(m.params), gib(m.grads), gib(m.optimizer), gib(m.activations), gib(m.comm))
end

-- The advice for a run that does not fit `mem_bytes` per rank (one sentence).
function M.advice(cfg, world, mem_bytes, current)
  local best, sets = M.cheapest(cfg, world, mem_bytes, current)
  if best then
    local slower = current and (best.step_s / current.step_s - 1) * 100
    return ("the cheapest change that fits is %s (about %s GiB per rank%s)"):format(
      sets, gib(best.mem.total),
      slower and slower > 0.5 and (", a step about %.0f%% longer"):format(slower) or "")
  end
  return ("no change of train.recompute, parallel.zero_stage, pipeline stages, micro-batch " ..
          "or offload fits on %d rank%s: `tetra plan` weighs layouts with more ranks (--nodes)"):format(
          world, world == 1 and "" or "s")
end

-- Raises one config error line when cfg's layout needs more memory per rank than its
-- device has (the estimate, its parts, the memory and the advice); nothing otherwise, and
-- nothing for a model the planner cannot price (one its recipe defines in code).
function M.check(cfg, world)
  if not priced(cfg) then return end
  local mem, source = M.device_memory(cfg)
  if not mem then return end
  local r = M.estimate(cfg, world, mem)
  if r.mem.total <= mem then return end
  require("tetra.config.registry").error(
    "this layout needs about %s GiB per rank (the planner's estimate for stage %d: %s), " ..
    "more than %s: %s; or set train.device_memory_gib if the estimate is wrong",
    gib(r.mem.total), r.mem.stage, describe(r), source, M.advice(cfg, world, mem, r))
end

-- The engine's "out of memory on DEVICE allocating ..." error (msg) as a user error with
-- the planner's estimate and the same advice as the check's, where they can be made.
function M.out_of_memory(msg, cfg, world)
  msg = tostring(msg):gsub("^[^\n]-: (out of memory on)", "%1"):match("^[^\n]*")
  local extra = ""
  if cfg and priced(cfg) then
    local ok, text = pcall(function()
      local mem = M.device_memory(cfg)
      local r = M.estimate(cfg, world, mem)
      local target = math.min(mem or math.huge, r.mem.total) * 0.8
      return ("; the planner estimated %s GiB per rank for this layout; %s"):format(
        gib(r.mem.total), M.advice(cfg, world, target, r))
    end)
    if ok then extra = text end
  end
  return errors.new(msg .. extra)
end

return M
