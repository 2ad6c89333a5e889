-- tetra.models: the model families, found by folder. A family is a folder recipes/NAME/
-- holding
--   model.lua    the recipe: the model class and its defaults (tetra.train.recipe)
--   plan.lua     how tetra.parallel splits it (tensor, context, pipeline)
--   presets.lua  its published shapes and what the library must know of its parameters
--   hf.lua       (optional) its Hugging Face config keys and tensor names
-- Nothing in lua/tetra/ names a family: the library lists recipes/*/ and reads these.
-- Adding a model is adding a folder.
--
--   models.names()           -- { "gpt2", "llama", ... }, sorted
--   models.get("llama")      -- its presets.lua table (name and dir added), nil if none
--   models.of(m)             -- the family of model keys m (m.family, default llama)
--   models.presets()         -- preset name -> model keys (family included), all families
--   models.plan(name), models.recipe(name), models.hf(name)
--   models.family_of(Model)  -- the family whose model.lua builds class Model, or nil
--
-- presets.lua returns { presets = { NAME = model keys }, parameters = function(m), and
-- the traits below }:
--   parameters(m)        every parameter as { module path, name, shape } in the order the
--                        forward uses them (the planner's memory, FLOPs and recompute)
--   embedding, head      module paths of the token embedding and the output projection
--   tied                 true: the head always reads the embedding's matrix
--   rotary               true: rotary positions (the head size must be even)
--   ffn_hidden(dim)      the MLP width when model.ffn_hidden is unset
--   block                what one block's forward makes beyond its matmuls (the planner's
--                        activation count): layer_norm (mean and 1/std kept, else 1/rms),
--                        out_bias (biased row-parallel outputs), gated_mlp (SwiGLU),
--                        learned_positions (a position embedding added to the tokens')
--   eager_elementwise    true: cluster.elementwise = eager has a hand count for it
local host = require("tetra.host")
local errors = require("tetra.util.errors")

local M = {}

-- The family model keys name when they name none.
M.default = "llama"

-- The recipes folders: the library root's (TETRA_HOME, an install) first, then the source
-- tree the binary was built from.
local function roots()
  local out = { host.root .. "/recipes" }
  if host.source_dir ~= host.root then out[2] = host.source_dir .. "/recipes" end
  return out
end

local function readable(path)
  local f = io.open(path)
  if f then f:close() end
  return f ~= nil
end

local dirs   -- name -> folder, found once

local function find()
  if dirs then return dirs end
  dirs = {}
  for _, root in ipairs(roots()) do
    for _, name in ipairs(host.listdir(root) or {}) do
      local dir = root .. "/" .. name
      if not dirs[name] and readable(dir .. "/model.lua") then dirs[name] = dir end
    end
  end
  return dirs
end

function M.names()
  local out = {}
  for name in pairs(find()) do out[#out + 1] = name end
  table.sort(out)
  return out
end

local loaded = {}   -- "dir/part" -> what the file returned

-- recipes/NAME/PART.lua's value, loaded once; nil when optional and absent.
local function part(name, what, optional)
  local dir = find()[name]
  if not dir then
    errors.raise("unknown model family '%s': recipes/ has %s", tostring(name),
                 table.concat(M.names(), ", "))
  end
  local path = dir .. "/" .. what .. ".lua"
  if loaded[path] == nil then
    if optional and not readable(path) then return nil end
    local chunk, err = loadfile(path)
    if not chunk then errors.raise(err) end
    loaded[path] = chunk()
  end
  return loaded[path]
end

function M.get(name)
  if not find()[name] then return nil end
  local fam = part(name, "presets")
  fam.name, fam.dir = name, find()[name]
  return fam
end

function M.of(m)
  local name = m.family or M.default
  return M.get(name) or part(name, "presets")   -- part: the one-line error
end

function M.plan(name) return part(name, "plan") end
function M.recipe(name) return part(name, "model") end
function M.hf(name) return part(name, "hf", true) end

-- The family whose model.lua builds class Model (by its class name), or nil.
function M.family_of(Model)
  local class = Model and Model.__name
  for _, name in ipairs(M.names()) do
    if class and M.recipe(name).Model.__name == class then return name end
  end
end

function M.presets()
  local out = {}
  for _, name in ipairs(M.names()) do
    for preset, keys in pairs(M.get(name).presets or {}) do
      if out[preset] then
        errors.raise("model preset '%s' is defined by recipes/%s and recipes/%s",
                     preset, out[preset].family, name)
      end
      local m = { family = name }
      for k, v in pairs(keys) do m[k] = v end
      out[preset] = m
    end
  end
  return out
end

return M
