-- tetra.checkpoint: save and resume the whole training state.
--
--   checkpoint.save(env)            -- DIR/step_NNNNNN/ for env.step_count, then DIR/latest
--   checkpoint.resume(env)          -- per checkpoint.resume; returns the path loaded or nil
--   checkpoint.load(env, path)      -- one checkpoint directory into env
--
-- Layout of DIR/step_000120/ (DIR = checkpoint.dir):
--   model.safetensors         the parameters (one process)
--   optim.safetensors         AdamW m.NAME / v.NAME (SGD: momentum.NAME) per parameter,
--                             step count in the metadata (one process)
--   shard_00003.safetensors   under tensor, pipeline, context or data parallelism,
--                             instead of model.safetensors and optim.safetensors:
--                             parameter slices rank 3 holds and their moments, each slice
--                             once: by the rank whose placement is primary
--                             (tetra.parallel), of context-parallel rank 0, and the
--                             data-parallel rank the slice falls to (they share the
--                             writing by elements, shards.written_here). Under ZeRO the
--                             ranks first put their shards' moments together on the
--                             writer (ZeRO-3: the parameters too), so the tensors are the
--                             same as without it and resume with or without ZeRO, on any
--                             rank count
--   index.json                with the shards: { tensors = { NAME = { shape = global shape,
--                             shards = { { file =, dim =, offset =, length = } } } } } for
--                             every parameter and moment (dim 0-based; a whole tensor is
--                             one shard with offset 0 and the full length of dim 0); a
--                             load assembles each rank's slices for its own layout from it,
--                             so a checkpoint written with TP=2 resumes on one process or
--                             with PP=2 (and a whole-parameter one under TP or PP)
--   loader_dp_00003.bin       the tetra.data loader state of data-parallel rank 3
--                             (binary; written by its rank of tp, cp and pp rank 0), when
--                             the data source has one (mock and byte data are functions
--                             of the step: nothing to record). A resume concatenates
--                             them all, which restores a loader of any data-parallel size
--   fp8_00003.json            rank 3's FP8 scaling state (train.precision=fp8): for each of
--                             its FP8 layers the scale, ring position and amax history of
--                             x, w and g; same layout: each rank reads its own, another
--                             layout: each layer from the lowest rank that saved it
--   state.json                step, tokens seen, engine RNG state, loss-scaler state, the
--                             data source's step, the loss guard's spike window and
--                             skipped data windows (tetra.train.guard), world size, config
--   checksums.json            { FILE = CRC-32C (8 hex digits) } of every other file; for a
--                             safetensors file { crc =, block =, blocks = } with the CRC
--                             of each block of it too (4 KiB to 4 MiB, about 1024 a
--                             file): each rank sums the files it wrote, rank 0 merges
--                             them; a load checks each file before reading it, or of a
--                             safetensors file the blocks it reads, and names a corrupt
--                             one
-- A save writes DIR/.tmp.step_000120/ (every file fsynced), renames it to step_000120,
-- then replaces DIR/latest (the directory name, written to a temporary file and renamed)
-- last; under MPI the ranks meet at a barrier first, so `latest` moves only once all of
-- them wrote. A crash leaves at worst a .tmp.* directory, which resume ignores and the
-- next save removes. Then all but the newest checkpoint.keep checkpoints are removed.
-- The parts: tetra.checkpoint.save (the three-part save), .async (checkpoint.async),
-- .shards (slices, index.json, the reshard on load), .dir (checksums, `latest`, pruning),
-- .rng (the RNG state as text), .weights (the parameters alone); files through
-- tetra.util.fs, JSON through tetra.util.json.
local host = require("tetra.host")
local metrics = require("tetra.obs.metrics")
local fs = require("tetra.util.fs")
local json = require("tetra.util.json")
local fail = require("tetra.util.errors").raise
local folder = require("tetra.checkpoint.dir")
local rng = require("tetra.checkpoint.rng")
local shards = require("tetra.checkpoint.shards")
local save = require("tetra.checkpoint.save")
local async = require("tetra.checkpoint.async")
local weights = require("tetra.checkpoint.weights")

local M = {}

M.step_name = folder.step_name
M.prune = folder.prune

-- -- Save ----------------------------------------------------------------------------

-- Writes checkpoint.dir/step_NNNNNN for env's current step on every rank (collective
-- under MPI). Returns the checkpoint's path. With an asynchronous save in flight, it
-- is completed first.
function M.save(env)
  async.drain(env)
  -- ZeRO-3: the plan's parameters are host copies, taken unit by unit (shards.local_slices).
  local plan = save.plan(env)
  local ok, crcs = pcall(save.write_files, plan)
  if not ok then save.abandon(plan, crcs) end
  local delay = (env.cfg.checkpoint or {}).save_delay_ms or 0
  if delay > 0 then host.sleep(delay / 1000) end   -- a test switch
  return save.finish(env, plan, crcs)
end

-- checkpoint.async: save_async starts a save written by a background thread, poll (at
-- each step boundary) publishes it once written, drain waits for it.
M.save_async, M.poll, M.drain = async.save, async.poll, async.drain

-- Whether train.run saves after `step` of `total`: with checkpoint.dir set, at the last
-- step, and every checkpoint.every steps when that is > 0.
function M.due(cfg, step, total)
  local ck = cfg.checkpoint or {}
  local every = ck.every or 0
  if not ck.dir or ck.dir == "" then return false end
  return step == total or (every > 0 and step % every == 0)
end

-- -- Load ----------------------------------------------------------------------------

-- The checkpoint checkpoint.resume asks for: true / "auto" -> checkpoint.dir/latest
-- (nil when there is none yet: a fresh start); a path -> that checkpoint (or the
-- latest of the checkpoint directory it names); false / nil -> nil.
function M.resume_path(cfg)
  local ck = cfg.checkpoint or {}
  local r = ck.resume
  if r == nil or r == false or r == "" or r == "false" then return nil end
  if r == true or r == "auto" or r == "true" then
    if not ck.dir or ck.dir == "" then fail("checkpoint.resume=%s needs checkpoint.dir", tostring(r)) end
    local latest = fs.read_file(ck.dir .. "/latest")
    if not latest then return nil end
    return folder.follow_latest(ck.dir, latest)
  end
  if type(r) ~= "string" then fail("checkpoint.resume must be true, \"auto\" or a path, got %s", tostring(r)) end
  return r
end

-- tetra.checkpoint.dir's open for a resume, which a weights-only checkpoint cannot serve.
local function open_resumable(path)
  local state
  path, state = folder.open(path)
  if state.weights_only then
    fail("checkpoint %s holds weights only (no optimizer, RNG or data state: converted " ..
         "from Hugging Face?): start training from it with --set model.init_from=%s, " ..
         "not checkpoint.resume", path, path)
  end
  return path, state
end

-- The checks of the checkpoint checkpoint.resume names that need no model (tetra.train
-- runs them before building one): one line for a missing, incomplete or corrupt one;
-- and of checkpoint.dir.
function M.precheck(cfg)
  local path = M.resume_path(cfg)
  if path then open_resumable(path) end
  -- checkpoint.dir is written at the last step at the latest: a folder that cannot be
  -- made or written stops the run now, not after its training.
  local dir = (cfg.checkpoint or {}).dir
  if dir and dir ~= "" then fs.writable_dir(dir, "checkpoint.dir") end
end

local fp8_layers = save.fp8_layers

-- Restores the FP8 scaling state of env's layers from checkpoint `path`: this rank's own
-- fp8_RRRRR.json when the checkpoint was written by as many ranks, otherwise (another
-- layout) each layer's state from the lowest rank that saved it.
local function load_fp8(env, path, state)
  local names = {}
  for _, e in ipairs(fs.listdir(path) or {}) do
    if e:match("^fp8_%d+%.json$") then names[#names + 1] = e end
  end
  table.sort(names)
  if #names == 0 then
    if (env.rank or 0) == 0 then
      io.stderr:write("checkpoint: ", path, " has no FP8 scaling state (saved in another ",
                      "precision): the amax histories start empty\n")
    end
    return
  end
  local own = string.format("fp8_%05d.json", env.rank or 0)
  if state.world_size == save.world_size(env) and fs.exists(path .. "/" .. own) then names = { own } end
  local merged = {}
  for i = #names, 1, -1 do   -- the lowest rank last, so its entries win
    folder.verify(path .. "/" .. names[i])
    local ok, d = pcall(json.decode, fs.read_file(path .. "/" .. names[i]))
    if not ok or type(d) ~= "table" then fail("checkpoint: %s/%s is corrupt", path, names[i]) end
    for layer, e in pairs(d) do merged[layer] = e end
  end
  env.amp:load_fp8_state_dict(merged, function(layer)
    fail("checkpoint %s holds no FP8 scaling state for layer %s (train.fp8_layers differs " ..
         "from the saved run's?)", path, layer)
  end)
end

-- The data loader's state: every data-parallel rank's loader_dp_*.bin, concatenated.
local function load_loader(env, path, state)
  if type(state.data) ~= "table" then
    fail("checkpoint %s has no data-loader state but this run's data source needs one", path)
  end
  local names = {}
  for _, e in ipairs(fs.listdir(path) or {}) do
    if e:match("^loader_dp_%d+%.bin$") then names[#names + 1] = e end
  end
  table.sort(names)
  if #names == 0 then fail("checkpoint %s has no loader_dp_*.bin files", path) end
  local blobs = {}
  for i, name in ipairs(names) do
    folder.verify(path .. "/" .. name)
    blobs[i] = fs.read_file(path .. "/" .. name)
  end
  env.data:load_state({ step = state.data.step, loader = table.concat(blobs) })
end

-- Loads the checkpoint directory `path` into env (model, optimizer, step, tokens seen,
-- RNG, loss scaler, data source); the next env.step() is the step after the saved one.
function M.load(env, path)
  local state
  path, state = open_resumable(path)
  -- A captured step (train.cuda_graphs) read the tensors the load may replace: the next
  -- step captures again.
  if env.drop_graph then env.drop_graph() end
  local opt = env.optimizer
  if state.optimizer ~= (opt.m and "adamw" or "sgd") then
    fail("checkpoint %s holds %s state but the optimizer is %s", path, tostring(state.optimizer),
         opt.m and "adamw" or "sgd")
  end
  -- the bytes of its files this rank read, { copied =, summed = } (under ZeRO about 1/dp
  -- of them each)
  env.resume_read_bytes = shards.load_state(env, path)
  opt.step_count = tonumber(state.optimizer_step) or state.step

  local scaler = env.amp and env.amp.scaler
  if scaler and type(state.scaler) == "table" then scaler:load_state_dict(state.scaler) end
  if fp8_layers(env) then load_fp8(env, path, state) end
  if not rng.restore(state.rng) then fail("checkpoint: %s/state.json: bad rng state", path) end
  if env.data.load_state then load_loader(env, path, state) end
  if env.guard then env.guard:load_state(state.guard) end
  env.step_count = state.step
  env.tokens_seen = state.tokens_seen or 0
  if type(env.ddp.step) == "number" then env.ddp.step = state.step end
  env.resumed_from = path
  return path
end

-- model.init_from=path, a Tetra checkpoint (a weights-only one from tetra convert, or a
-- training one), or a Hugging Face folder whose tensors `index` lists
-- (tetra.checkpoint.hf's sliced_index; it has no checksums): env's parameters, this
-- rank's part of each, read from it whatever layout wrote it; nothing else (the
-- optimizer, step and RNG start fresh).
function M.init_weights(env, path, index)
  if index then folder.without_checksums() else path = folder.open(path) end
  if env.drop_graph then env.drop_graph() end
  env.init_read_bytes = shards.load_state(env, path, true, index)
  env.initialised_from = path
end

-- Loads the checkpoint checkpoint.resume asks for into env, if any; returns its path.
function M.resume(env)
  local path = M.resume_path(env.cfg)
  if path then return M.load(env, path) end
  return nil
end

-- A resumed run keeps the metrics records of the steps up to the checkpoint (later ones
-- were lost with the run that wrote them): those of path with step <= step.
function M.metrics_before(path, step)
  if not path or path == "" or not fs.exists(path) then return {} end
  local kept = {}
  for _, r in ipairs(metrics.read(path)) do
    if r.step and r.step <= step then kept[#kept + 1] = r end
  end
  return kept
end

-- -- Weights alone (tetra convert, model.init_from) -----------------------------------

-- open_weights(path): the parameters of any checkpoint, read whole; save_weights(path,
-- entries, config, origin): a weights-only checkpoint (see tetra.checkpoint.weights).
M.open_weights, M.save_weights = weights.open, weights.save

return M
