-- How tetra.parallel splits model.lua's Qwen2: as the Llama it is (recipes/llama/plan.lua).
-- The q, k and v biases follow their weights' rows (column, heads_column), as GPT-2's do.
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
return dofile(here .. "/../llama/plan.lua")
