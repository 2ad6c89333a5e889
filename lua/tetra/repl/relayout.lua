-- tetra.repl.relayout: relayout{ tp =, pp =, cp =, dp = } in a session: the same model
-- and optimizer state re-sharded into another layout of the same ranks.
local errors = require("tetra.util.errors")
local fs = require("tetra.util.fs")
local layout = require("tetra.parallel.layout")
local deep_copy = require("tetra.config").copy
local session = require("tetra.repl.session")

local M = {}

local function layout_text(cfg)
  local s = layout.sizes(cfg)
  return ("tp=%d cp=%d dp=%d pp=%d"):format(s.tp, s.cp, s.dp, s.pp)
end

-- A directory every rank names alike (rank 0's pid, agreed over the world).
local function relayout_dir(mesh)
  local ffi = require("ffi")
  pcall(ffi.cdef, "int getpid(void);")
  local T = require("tetra.tensor")
  local pid = T.full({ 1 }, mesh.rank == 0 and ffi.C.getpid() or 0, { dtype = "i32" })
  mesh.world:all_reduce(pid, "max")
  return ("%s/tetra-relayout-%d"):format(os.getenv("TMPDIR") or "/tmp",
                                         pid:data_ptr("int32_t *")[0])
end

-- relayout{ tp =, pp =, cp =, dp = } (missing: 1; dp: what the world size leaves): the
-- same model and optimizer state in a new layout of the same ranks. The state goes
-- through a checkpoint (saved in this layout, loaded into the new one: the reshard path
-- tetra.checkpoint has for any layout), so training goes on as a run resumed in the new
-- layout would. Every rank runs it.
function M.add(env)
  function env.relayout(spec)
    if type(spec) ~= "table" then
      error("relayout{ tp = 2, pp = 2 }: give the new sizes in a table", 2)
    end
    local recipe, mesh = rawget(env, "recipe"), rawget(env, "mesh")
    if not (recipe and recipe.setup and mesh and rawget(env, "optimizer")) then
      error("relayout() needs the session of a recipe (tetra -i RECIPE)", 2)
    end
    for k, v in pairs(spec) do
      if not layout.size_keys[k] then
        error(("relayout: unknown key '%s' (tp, cp, pp, dp)"):format(tostring(k)), 2)
      end
      if type(v) ~= "number" or v < 1 or v % 1 ~= 0 then
        error(("relayout: %s must be a positive whole number, got %s"):format(k, tostring(v)), 2)
      end
    end
    local world = mesh.size
    local sizes = { tp = spec.tp or 1, cp = spec.cp or 1, pp = spec.pp or 1 }
    sizes.dp = spec.dp or math.max(1, math.floor(world / (sizes.tp * sizes.cp * sizes.pp)))
    local cfg = deep_copy(env.cfg)
    cfg.parallel = cfg.parallel or {}
    for k, key in pairs(layout.size_keys) do cfg.parallel[key] = sizes[k] end
    local problems = layout.problems(cfg, world)
    if #problems > 0 then
      errors.raise("relayout: %s", table.concat(problems, "; "))
    end
    -- The recipe's own env holds the live state (its step() counts in it).
    local current = rawget(env, "env") or env
    local checkpoint = require("tetra.checkpoint")
    local dir = relayout_dir(mesh)
    local saved_ck = current.cfg.checkpoint
    current.cfg.checkpoint = { dir = dir, keep = 0 }
    local ok, path = pcall(checkpoint.save, current)
    current.cfg.checkpoint = saved_ck
    if not ok then error(path, 0) end
    local from = layout_text(env.cfg)
    cfg.checkpoint = deep_copy(saved_ck) or {}
    cfg.checkpoint.resume = nil
    local built
    ok, built = pcall(function()
      local b = recipe.setup(cfg)
      checkpoint.load(b, path)
      return b
    end)
    mesh.world:barrier()
    -- A scratch copy: failing to remove it must not hide how the load went.
    if mesh.rank == 0 then pcall(fs.remove_tree, dir, "relayout") end
    if not ok then error(built, 0) end
    for k, v in pairs(built) do env[k] = v end
    env.env, env.cfg = built, cfg
    session.wrap_step(env)
    collectgarbage("collect")
    print(("relayout: %s -> %s at step %d"):format(from, layout_text(cfg), built.step_count))
  end
end

return M
