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
--
--   tetra run recipes/llama.lua --set model.dim=512 --set train.steps=100
local tetra = require("tetra")
local nn, train = tetra.nn, tetra.train
local F = nn.functional

local Llama = nn.Module:extend("Llama")

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
  if not c.tie_embeddings then
    self:add("output", nn.Linear(c.dim, c.vocab_size, { std = std }))
  end
end

-- ids: (B, T) int -> logits: (B, T, vocab_size)
function Llama:forward(ids)
  local x = self.tok_embeddings(ids)
  local h = self.layers(x)
  F.free(x)
  local n = self.norm(h)
  F.free(h)
  local head = self.output and self.output.weight or self.tok_embeddings.weight
  local logits = tetra.amp.linear(self, n, head)   -- at train.precision
  F.free(n)
  return logits
end

return train.recipe {
  name = "llama",
  Model = Llama,
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
