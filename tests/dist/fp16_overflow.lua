-- recipes/tiny.lua at train.precision=fp16 with an inf written into one gradient on one
-- rank only (the last one) at train.inject_step, after the DP average (with ZeRO-1: into
-- that rank's gradient shard): every rank must
-- skip that step and back off its loss scale together (the overflow flag is all-reduced
-- over the DP group), so the run follows the single process with the same injection.
-- Used by tests/dist/dp2_fp16_parity.sh through tools/compare_loss.
local tetra = require("tetra")
local train = tetra.train
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")

local defaults = {}
for section, keys in pairs(tiny.defaults) do
  defaults[section] = {}
  for k, v in pairs(keys) do defaults[section][k] = v end
end
defaults.train.precision = "fp16"
defaults.train.inject_step = 5
defaults.train.loss_scale_init = 1024
defaults.train.loss_scale_growth_interval = 3

local recipe = { name = "fp16_overflow", Model = tiny.Model, defaults = defaults }

function recipe.run(cfg)
  local data = train.data_source(cfg)
  tetra.manual_seed(cfg.train.seed)
  local model = tiny.Model(cfg.model)
  local env = train.setup(cfg, model, data, { plan = tiny.plan, on_grads = function(e, step)
    if step == cfg.train.inject_step and e.rank == e.mesh.size - 1 then
      -- The optimizer's params: under ZeRO-1 this rank's shards, whose grads are the
      -- ones unscaled, checked and stepped.
      local ps = e.optimizer.params
      require("tetra.ffi").C.tt_tensor_set(ps[#ps]._grad, 0, 1 / 0)
    end
  end })
  local summary = train.run(env)
  local rows = summary.records
  local skipped = {}
  for _, r in ipairs(rows) do if r.skipped then skipped[#skipped + 1] = r.step end end
  if env.rank == 0 then
    print(string.format("fp16_overflow: skipped steps {%s}, loss scale %g",
                        table.concat(skipped, ","), env.amp:scale()))
  end
  if #skipped ~= 1 or skipped[1] ~= cfg.train.inject_step then
    error("fp16_overflow: expected exactly step " .. cfg.train.inject_step .. " skipped", 0)
  end
end

return recipe
