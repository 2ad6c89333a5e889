-- The gpt2 recipe under its short name (tetra run recipes/gpt2.lua): the model, its plan,
-- presets and Hugging Face names live in recipes/gpt2/.
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
return dofile(here .. "/gpt2/model.lua")
