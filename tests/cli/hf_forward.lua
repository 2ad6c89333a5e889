-- Tetra's side of tests/cli/hf_convert.sh: the logits and loss of a model started from
-- model.init_from (a checkpoint or hf:DIR) on fixed tokens.
--   tetra -e 'dofile(arg[1])' tests/cli/hf_forward.lua RECIPE SOURCE TOKENS OUT [k=v ...]
-- TOKENS: a safetensors file with "tokens" (B, T + 1) int64. OUT gets "logits" (B, T, V)
-- and "loss" (the mean cross-entropy of tokens[:, 1:] given tokens[:, :T]).
local tetra = require("tetra")
local F = tetra.nn.functional
local config = require("tetra.config")
local recipe_path, source, tokens_path, out = arg[2], arg[3], arg[4], arg[5]
local sets = { "model.init_from=" .. source }
for i = 6, #arg do sets[#sets + 1] = arg[i] end
local recipe = dofile(recipe_path)
local cfg = config.build({ defaults = recipe.defaults, sets = sets, world_size = false })
local model = recipe.Model(cfg.model)
require("tetra.checkpoint.hf").init_weights(model, source)
local tokens = tetra.io.load(tokens_path).tokens
tetra.no_grad(function()
  local ids, targets = F.inputs_targets(tokens)
  local logits = model(ids)
  local loss = F.cross_entropy(logits, targets)
  tetra.io.save(out, { logits = logits, loss = loss })
  print(string.format("tetra loss %.9g", loss:item()))
end)
