-- A recipe for tp_generate.sh: the tiny Llama trained 3 steps in the layout --set gives,
-- then 12 tokens generated greedily; rank 0 prints them on one line ("ids: ...").
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")

local recipe = { name = "tp_generate", defaults = tiny.defaults }

function recipe.run(cfg)
  local env = tiny.setup(cfg)
  for _ = 1, 3 do env.step() end
  local ids = env.generate({ 1, 2, 3, 4 }, { max_new_tokens = 12, temperature = 0 })
  if env.rank == 0 then print("ids: " .. table.concat(ids, " ")) end
  return 0
end

return recipe
