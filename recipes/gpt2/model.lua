-- GPT-2 (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners").
--
--   tokens -> token embedding (wte) + learned position embedding (wpe)
--          -> n_layers x [ LayerNorm -> attention -> +residual
--                          LayerNorm -> GELU MLP (4x) -> +residual ]
--          -> LayerNorm -> logits through wte (tied input/output embedding)
-- Attention: multi-head, causal, no rotary embedding; every linear layer has a bias.
-- GELU is the tanh approximation GPT-2 was trained with. Init: Normal(0, 0.02), biases 0,
-- residual output projections (attn.wo, mlp.c_proj) 0.02 / sqrt(2 * n_layers).
--
--   tetra run recipes/gpt2.lua --set train.model_name=gpt2-124m
-- (recipes/gpt2.lua is this recipe under its short name.) Parallelism is not this file's
-- business: plan.lua beside it says how tetra.parallel splits this model; presets.lua
-- holds the published shapes, hf.lua the Hugging Face names.
local tetra = require("tetra")
local nn, train = tetra.nn, tetra.train
local F = nn.functional

local GPT2 = nn.Module:extend("GPT2")

function GPT2:init(c)
  local std = c.init_std or 0.02
  local out_std = nn.residual_std(c.n_layers, std)
  self:add("wte", nn.Embedding(c.vocab_size, c.dim, { std = std }))
  self:add("wpe", nn.Embedding(c.seq_len, c.dim, { std = std }))
  self:add("h", nn.ModuleList())
  for _ = 1, c.n_layers do
    self.h:append(nn.TransformerBlock {
      { "ln_1", nn.LayerNorm(c.dim, c.norm_eps) },
      { "attn", nn.Attention { dim = c.dim, n_heads = c.n_heads, rope = false, bias = true,
                               std = std, out_std = out_std } },
      { "ln_2", nn.LayerNorm(c.dim, c.norm_eps) },
      { "mlp", nn.GeluMLP { dim = c.dim, hidden = c.ffn_hidden, std = std,
                            out_std = out_std } },
    })
  end
  self:add("ln_f", nn.LayerNorm(c.dim, c.norm_eps))
  -- The head reads the token embedding's matrix (tied); it stays out of FP8.
  self:add("lm_head", nn.Linear(c.dim, c.vocab_size, { weight = self.wte.weight, fp8 = false }))
  self.positions = {}   -- "T@device" -> i64 tensor 0..T-1, built once per length and device
end

-- The three parts of forward; pipeline stages run them apart.
-- ids (B, T), positions (T) or nil for 0..T-1 -> (B, T, D)
function GPT2:embed(ids, positions)
  local pos = positions
  if not pos then   -- (made on the ids' device: the table wpe looks them up in is there)
    local T = tonumber(ids._shape[1])
    local key = T .. "@" .. tostring(ids._device)
    pos = self.positions[key] or tetra.tensor.moved(F.arange_i64(T), ids._device)
    self.positions[key] = pos
  end
  local tok, p = self.wte(ids), self.wpe(pos)       -- (B, T, D), (T, D)
  local x = F.add(tok, p)
  F.free(tok); F.free(p)
  return x
end

-- h (B, T, D), the last block's output -> logits (B, T, vocab_size)
function GPT2:head(h)
  local n = self.ln_f(h)
  local logits = self.lm_head(n)
  F.free(n)
  return logits
end

-- ids: (B, T) int; positions as embed's -> logits: (B, T, vocab_size)
function GPT2:forward(ids, positions)
  local x = self:embed(ids, positions)
  local h = self.h(x, positions)
  F.free(x)
  local logits = self:head(h)
  F.free(h)
  return logits
end

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."

return train.recipe {
  name = "gpt2",
  Model = GPT2,
  plan = dofile(here .. "/plan.lua"),
  defaults = {
    model = { vocab_size = 4096, dim = 256, n_layers = 4, n_heads = 4, ffn_hidden = 1024,
              seq_len = 256, norm_eps = 1e-5, tie_embeddings = true, init_std = 0.02 },
    train = { steps = 50, batch_size = 8, lr = 6e-4, min_lr = 6e-5, warmup_steps = 10,
              lr_schedule = "cosine", weight_decay = 0.1, max_grad_norm = 1.0 },
    optim = { name = "adamw", beta1 = 0.9, beta2 = 0.95, eps = 1e-8 },
    data = { mock = true },
  },
}
