-- tetra.checkpoint.weights: the parameters alone, for `tetra convert` and model.init_from:
-- read from any checkpoint whatever layout wrote it, or written as a weights-only one.
local T = require("tetra.tensor")
local fs = require("tetra.util.fs")
local json = require("tetra.util.json")
local fail = require("tetra.util.errors").raise
local folder = require("tetra.checkpoint.dir")
local rng = require("tetra.checkpoint.rng")
local shards = require("tetra.checkpoint.shards")

local M = {}

-- Opens the parameters of checkpoint `path` (or the one its latest names), whatever
-- layout wrote them, checksums verified. Returns { path =, state = (state.json), names =
-- (sorted parameter names, no optimizer moments), shape = fn(name) -> the whole shape,
-- read = fn(name) -> the whole parameter as a new tensor, close = fn() }.
function M.open(path)
  local state
  path, state = folder.open(path)
  local tensors = shards.load_index(path)
  local names, moments = {}, { m = true, v = true, momentum = true }
  for name in pairs(tensors) do
    if not moments[name:match("^([%w_]+)%.") or ""] then names[#names + 1] = name end
  end
  table.sort(names)
  local files = {}
  local w = { path = path, state = state, names = names }
  function w.shape(name)
    local e = tensors[name]
    return e and e.shape
  end
  function w.read(name)
    local e = tensors[name]
    if not e then fail("checkpoint %s has no tensor '%s'", path, name) end
    local t = T.empty(e.shape)
    T.no_grad(function()
      shards.assemble(path, tensors, files, name,
                      { shape = e.shape, dim = 0, offset = 0, length = e.shape[1] }, t)
    end)
    return t
  end
  function w.close()
    for _, f in pairs(files) do f:close() end
    files = {}
  end
  return w
end

-- Writes a checkpoint directory `path` that holds weights only: model.safetensors
-- (entries: an array of { name, tensor }), state.json (step 0, weights_only, `config`)
-- and checksums.json, through a temporary directory renamed into place. Training starts
-- from it with model.init_from (fresh optimizer, RNG from train.seed); checkpoint.resume
-- refuses it.
function M.save(path, entries, config, origin)
  if fs.exists(path) then fail("%s already exists: choose a new output directory", path) end
  local tmp = path .. ".tmp"
  if fs.exists(tmp) then fs.remove_tree(tmp, "checkpoint") end
  fs.mkdir_p(tmp, "checkpoint.dir")
  local model_sums = folder.save_summed(tmp .. "/model.safetensors", entries)
  local state = json.encode({ format = 1, step = 0, tokens_seen = 0, weights_only = true,
    rng = rng.state_text(), origin = origin, config = config }) .. "\n"
  fs.write_file(tmp .. "/state.json", state, "checkpoint")
  local sums = {}
  sums["model.safetensors"] = model_sums
  sums["state.json"] = folder.crc_of_string(state)
  fs.write_file(tmp .. "/checksums.json", json.encode(sums) .. "\n", "checkpoint")
  fs.fsync(tmp, "checkpoint")
  fs.rename(tmp, path, "checkpoint")
  return path
end

return M
