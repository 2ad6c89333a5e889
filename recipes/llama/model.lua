-- Llama (Touvron et al. 2023, "Llama 2"; Meta 2024, "The Llama 3 Herd of Models").
--
-- A decoder-only transformer:
--   tokens -> embedding -> n_layers x [ RMSNorm -> attention -> +residual
--                                       RMSNorm -> SwiGLU MLP -> +residual ]
--          -> RMSNorm -> linear head (its own matrix, or the embedding when tied) -> logits
-- Attention: grouped-query (n_kv_heads key/value heads shared by n_heads query heads),
-- rotary position embeddings on q and k (rotate-half pairs, base rope_theta), causal.
-- No biases anywhere. Init: Normal(0, 0.02); the two residual output projections of each
-- block (attention.wo, feed_forward.w2) use 0.02 / sqrt(2 * n_layers).
-- Parameter names follow Meta's checkpoints (tok_embeddings, layers.N.attention.wq, ...).
-- Parallelism is not this file's business: plan.lua beside it says how tetra.parallel
-- splits this model over tensor, sequence, context and pipeline ranks; presets.lua holds
-- the published shapes (llama-7b, llama3-8b ...), hf.lua the Hugging Face names.
--
--   tetra run recipes/llama.lua --set model.dim=512 --set train.steps=100
-- (recipes/llama.lua is this recipe under its short name.)
local tetra = require("tetra")
local nn, train = tetra.nn, tetra.train
local F = nn.functional

local Llama = nn.Module:extend("Llama")

-- c: cfg.model.
function Llama:init(c)
  local std = c.init_std or 0.02
  local out_std = nn.residual_std(c.n_layers, std)
  self:add("tok_embeddings", nn.Embedding(c.vocab_size, c.dim, { std = std }))
  self:add("layers", nn.ModuleList())
  for _ = 1, c.n_layers do
    self.layers:append(nn.TransformerBlock {
      { "attention_norm", nn.RMSNorm(c.dim, c.norm_eps) },
      { "attention", nn.Attention { dim = c.dim, n_heads = c.n_heads,
                                    n_kv_heads = c.n_kv_heads, rope_theta = c.rope_theta,
                                    std = std, out_std = out_std } },
      { "ffn_norm", nn.RMSNorm(c.dim, c.norm_eps) },
      { "feed_forward", nn.SwiGLU { dim = c.dim, hidden = c.ffn_hidden, std = std,
                                    out_std = out_std } },
    })
  end
  self:add("norm", nn.RMSNorm(c.dim, c.norm_eps))
  -- The head: its own matrix, or the embedding's (tied). It stays out of FP8.
  self:add("output", nn.Linear(c.dim, c.vocab_size, {
    std = std, fp8 = false,
    weight = c.tie_embeddings and self.tok_embeddings.weight or nil }))
end

-- The three parts of forward; pipeline stages run them apart.
-- ids (B, T), positions (unused: RoPE rotates inside attention) -> (B, T, dim)
function Llama:embed(ids, _positions)
  return self.tok_embeddings(ids)
end

-- h (B, T, dim), the last block's output -> logits (B, T, vocab_size)
function Llama:head(h)
  local n = self.norm(h)
  local logits = self.output(n)
  F.free(n)
  return logits
end

-- ids: (B, T) int; positions: (T) i64, the positions of ids in their sequences, nil for
-- 0..T-1 -> logits (B, T, vocab_size)
function Llama:forward(ids, positions)
  local x = self:embed(ids, positions)
  local h = self.layers(x, positions)
  F.free(x)
  local logits = self:head(h)
  F.free(h)
  return logits
end

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."

return train.recipe {
  name = "llama",
  Model = Llama,
  plan = dofile(here .. "/plan.lua"),
  defaults = {
    model = { vocab_size = 4096, dim = 256, n_layers = 4, n_heads = 4, n_kv_heads = 4,
              ffn_hidden = 768, seq_len = 256, norm_eps = 1e-5, rope_theta = 10000.0,
              tie_embeddings = false, init_std = 0.02 },
    train = { steps = 50, batch_size = 8, lr = 3e-4, min_lr = 3e-5, warmup_steps = 10,
              lr_schedule = "cosine", weight_decay = 0.1, max_grad_norm = 1.0 },
    optim = { name = "adamw", beta1 = 0.9, beta2 = 0.95, eps = 1e-8 },
    data = { mock = true },
  },
}
