-- The llama recipe under its short name (tetra run recipes/llama.lua): the model, its plan,
-- presets and Hugging Face names live in recipes/llama/.
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
return dofile(here .. "/llama/model.lua")
