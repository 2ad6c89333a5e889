-- model.init_from: start training from the weights of a Hugging Face folder (hf:DIR) or
-- of a Tetra checkpoint directory (its parameters only: fresh optimizer, step 0, RNG
-- from train.seed). The model's shape (dims, heads, vocabulary ...) comes from the
-- source's config; a YAML or --set value that contradicts it is an error. tetra.checkpoint.hf
-- does the reading; tetra.train copies the weights in once the model is built.
local models = require("tetra.models")
local config = require("tetra.config.registry")

-- The keys the source decides; seq_len only where it is a weight's shape (learned
-- positions, as GPT-2's wpe).
local DECIDED = { "family", "dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                  "ffn_hidden", "norm_eps", "rope_theta", "tie_embeddings", "seq_len" }

config.register_model_source(function(merged, user)
  local source = merged.model and merged.model.init_from
  if source == nil then return end
  local um = type(user.model) == "table" and user.model or {}
  local preset = (type(user.train) == "table" and user.train.model_name) or um.name
  if preset then
    config.error("model.init_from and the preset '%s' both name a model: drop the preset " ..
                 "(the shape comes from %s)", tostring(preset), tostring(source))
  end
  local ok, m = pcall(require("tetra.checkpoint.hf").model_config, source)
  if not ok then
    config.error("model.init_from: %s", type(m) == "table" and m.message or tostring(m))
  end
  for _, key in ipairs(DECIDED) do
    local v = m[key]
    local shapes_seq_len = models.get(m.family).block.learned_positions
    if v ~= nil and not (key == "seq_len" and not shapes_seq_len) then
      if um[key] ~= nil and um[key] ~= v then
        config.error("model.%s=%s contradicts model.init_from=%s, whose model has %s = %s: " ..
                     "drop model.%s", key, tostring(um[key]), source, key, tostring(v), key)
      end
      merged.model[key] = v
    end
  end
end)

return {
  model = {
    init_from = { type = "str", doc = "hf:DIR (a Hugging Face folder of a model family " ..
                  "with a recipes/<family>/hf.lua) or a Tetra checkpoint: its weights " ..
                  "and model shape, fresh optimizer" },
  },
}
