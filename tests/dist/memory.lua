-- A recipe for memory.sh: the tiny Llama set up in the layout --set gives; every rank
-- prints what it holds ("memory rank R tp T pp P params N grads N optimizer N", bytes)
-- after one step.
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")

local recipe = { name = "memory", defaults = tiny.defaults }

function recipe.run(cfg)
  local env = tiny.setup(cfg)
  local r = env.step()
  local c = env.mesh.coords
  io.stdout:write(string.format("memory rank %d tp %d pp %d params %d grads %d optimizer %d\n",
                                env.rank, c.tp, c.pp, r.param_bytes, r.grad_bytes,
                                r.optimizer_bytes))
  io.stdout:flush()
  return 0
end

return recipe
