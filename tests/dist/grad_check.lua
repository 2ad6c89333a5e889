-- A recipe for grad_check.sh: one optimizer step of the tiny Llama (or GPT-2 with
-- --set grad_check.gpt2=true) in the layout --set gives; once the gradients are complete
-- (averaged over data parallelism, tied copies summed) every rank writes the gradient of
-- each parameter slice it counts (placement primary; data- and context-parallel rank 0
-- only) to DIR/grads_RANK.safetensors, with
-- the slice's place in the whole parameter (dim, offset, length) in the metadata. Under
-- ZeRO-1 the averaged gradients live in the shards: they are put back together first.
local tetra = require("tetra")
local F = tetra.nn.functional
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")
local gpt2 = dofile(here .. "/../../recipes/gpt2.lua")

local defaults = {}
for k, v in pairs(tiny.defaults) do defaults[k] = v end
defaults.grad_check = { dir = "", gpt2 = false }

-- The averaged gradient of every local parameter (index-aligned with par:placements()).
local function whole_grads(env, entries)
  local params, grads = {}, {}
  for i, e in ipairs(entries) do params[i], grads[i] = e.tensor, e.tensor.grad end
  if not env.ddp.shards then return grads end
  local per_shard = {}
  for j, sh in ipairs(env.ddp.shards) do per_shard[j] = sh.tensor.grad end
  return env.ddp:gather_shards(per_shard, params)
end

local recipe = { name = "grad_check", defaults = defaults }

function recipe.run(cfg)
  local spec = cfg.grad_check.gpt2 and gpt2 or tiny
  local data = tetra.train.data_source(cfg)
  tetra.ffi.C.tt_manual_seed(cfg.train.seed or 0)
  local model = spec.Model(cfg.model)
  local dir = cfg.grad_check.dir
  local env = tetra.train.setup(cfg, model, data, { plan = spec.plan, on_grads = function(env)
    local entries = env.par:placements()
    local grads = whole_grads(env, entries)   -- collective under ZeRO-1
    -- Data- and context-parallel replicas hold the same averaged gradients: the first
    -- of them writes (as checkpoints do).
    local c = env.mesh.coords
    -- Which way the embedding's gradient travelled (grad_check.sh's sparse rows look).
    if env.rank == 0 and env.ddp.sparse_rows then
      print(string.format("sparse embedding rows: %d", env.ddp.sparse_rows))
    end
    -- Whether the buckets followed the order backward produced the gradients in.
    if env.rank == 0 and env.ddp.held then
      print(string.format("buckets held: %d, deferred: %d", env.ddp.held, env.ddp.deferred))
    end
    if c.dp ~= 0 or c.cp ~= 0 then return end
    local list, meta = {}, {}
    for i, e in ipairs(entries) do
      local pl = e.placement
      if pl.primary then
        list[#list + 1] = { pl.name, grads[i] }
        meta[pl.name] = string.format("%d:%d:%d", pl.dim, pl.offset, pl.length)
      end
    end
    require("tetra.io").save(string.format("%s/grads_%05d.safetensors", dir, env.rank), list, meta)
  end })
  env.step()
  return 0
end

return recipe
