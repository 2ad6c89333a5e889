-- Shared by the specs that hold a mode to "bit for bit the run without it"
-- (recompute_spec, offload_spec): a recipe's config built from --set strings, steps run
-- through its setup, and the comparison of two runs' records and final state.
--
--   local same = assert(loadfile(here .. "/same_steps.lua"))(expect)   -- the spec's expect
--   local cfg = same.build(recipe, sets)
--   local records, state, env = same.run(recipe, sets, steps [, with_moments])
--   same.expect_identical(recipe, base_sets, extra_sets, steps [, with_moments])
local expect = ...
local config = require("tetra.config")

local M = {}

function M.build(recipe, sets)
  local cfg = config.build({ defaults = recipe.defaults, sets = sets, world_size = false })
  cfg.log.progress = false
  return cfg
end

-- Every element of t as a flat table of numbers.
function M.flat(t)
  local buf, n = t:to_f64()
  local out = {}
  for i = 1, n do out[i] = buf[i - 1] end
  return out
end

-- Records of `steps` steps and the state after them (name -> table of numbers: the
-- weights, and with `with_moments` the optimizer's moments as m1.., v1..), and the env.
function M.run(recipe, sets, steps, with_moments)
  local env = recipe.setup(M.build(recipe, sets))
  local records = {}
  for i = 1, steps do records[i] = env.step() end
  local state = {}
  for name, p in env.model:iter_parameters() do state[name] = M.flat(p) end
  if with_moments then
    for i, m in ipairs(env.optimizer.m) do state["m" .. i] = M.flat(m) end
    for i, v in ipairs(env.optimizer.v) do state["v" .. i] = M.flat(v) end
  end
  return records, state, env
end

-- Runs with `sets` and with `sets` + `extra`: every step's loss and grad norm equal (or
-- both NaN: a step the guard skipped reports no norm), all the state equal. Returns both
-- runs' records and the second run's env.
function M.expect_identical(recipe, sets, extra, steps, with_moments)
  local with = {}
  for _, s in ipairs(sets) do with[#with + 1] = s end
  for _, s in ipairs(extra) do with[#with + 1] = s end
  local a, sa = M.run(recipe, sets, steps, with_moments)
  local b, sb, env = M.run(recipe, with, steps, with_moments)
  local function same(x, y) return x == y or (x ~= x and y ~= y) end
  for i = 1, steps do
    expect(b[i].loss).to_be(a[i].loss)
    expect(same(b[i].grad_norm, a[i].grad_norm)).to_be(true)
  end
  for name, w in pairs(sa) do expect(sb[name]).to_equal(w) end
  return a, b, env
end

return M
