-- Qwen2 (Yang et al. 2024, "Qwen2 Technical Report").
--
-- recipes/llama/model.lua's Llama with one change: the query, key and value projections
-- have biases (the output projection and the MLP have none). The rest is Llama's:
-- RMSNorm, grouped-query attention with rotary embeddings (rotate-half, base rope_theta),
-- SwiGLU, an untied head unless tie_embeddings. Parameter names are the Llama recipe's
-- (tok_embeddings, layers.N.attention.wq.bias, ...); hf.lua beside this file maps them
-- to Hugging Face's Qwen2ForCausalLM, plan.lua splits it, presets.lua holds the shapes.
--
--   tetra run recipes/qwen2/model.lua --set train.steps=100
--   tetra run recipes/qwen2/model.lua --set model.init_from=hf:Qwen2-0.5B
local tetra = require("tetra")
local nn, train = tetra.nn, tetra.train
local F = nn.functional

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local llama = dofile(here .. "/../llama/model.lua")

local Qwen2 = llama.Model:extend("Qwen2")

-- c: cfg.model.
function Qwen2:init(c)
  llama.Model.init(self, c)
  -- The biases start at zero, as Qwen2's initialisation sets them; the weights drawn
  -- above are the Llama's, in the same order.
  for _, block in ipairs(self.layers) do
    for _, proj in ipairs({ block.attention.wq, block.attention.wk, block.attention.wv }) do
      proj:param("bias", F.parameter(F.zeros({ proj.out_features })))
    end
  end
end

return train.recipe {
  name = "qwen2",
  Model = Qwen2,
  plan = dofile(here .. "/plan.lua"),
  defaults = {
    model = { vocab_size = 4096, dim = 256, n_layers = 4, n_heads = 4, n_kv_heads = 2,
              ffn_hidden = 768, seq_len = 256, norm_eps = 1e-6, rope_theta = 1000000.0,
              tie_embeddings = false, init_std = 0.02 },
    train = { steps = 50, batch_size = 8, lr = 3e-4, min_lr = 3e-5, warmup_steps = 10,
              lr_schedule = "cosine", weight_decay = 0.1, max_grad_norm = 1.0 },
    optim = { name = "adamw", beta1 = 0.9, beta2 = 0.95, eps = 1e-8 },
    data = { mock = true },
  },
}
