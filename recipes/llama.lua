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
-- Tensor parallelism (parallel.tensor_parallel_size > 1, tetra.parallel.tensor): the
-- embedding and the head split the vocabulary, attention splits heads, the MLP splits
-- hidden units, norms are replicated; each rank holds its slices of the single-process
-- weights for the same seed, and the loss is the vocab-parallel cross-entropy.
-- Context parallelism (parallel.context_parallel_size > 1, tetra.parallel.context): every
-- rank holds the whole model and two chunks of each sequence; attention gathers the keys
-- and values of the other chunks (the training loop slices the tokens and passes their
-- positions to forward).
-- Pipeline parallelism (parallel.pipeline_parallel_size > 1, tetra.parallel.pipeline):
-- every rank builds the whole model, then keeps its stage's blocks (the first stage the
-- embedding, the last one the final norm and the head) and runs embed / layers / head.
--
--   tetra run recipes/llama.lua --set model.dim=512 --set train.steps=100
local tetra = require("tetra")
local nn, train = tetra.nn, tetra.train
local F = nn.functional

local Llama = nn.Module:extend("Llama")
Llama.supports_tensor_parallel = true
Llama.supports_context_parallel = true
Llama.supports_pipeline_parallel = true

-- c: cfg.model; par: { tp = mesh.tp } to split the model over that group, { cp = mesh.cp }
-- to split sequences over that one (size > 1).
function Llama:init(c, par)
  local std = c.init_std or 0.02
  local out_std = nn.residual_std(c.n_layers, std)
  local g = par and par.tp and par.tp.size > 1 and par.tp or nil
  local tp = g and tetra.parallel.tensor
  local Attention, SwiGLU = nn.Attention, nn.SwiGLU
  local cpg = par and par.cp and par.cp.size > 1 and par.cp or nil
  if cpg then
    self.context_parallel = cpg
    Attention = tetra.parallel.context.Attention
  end
  if g then
    self.tensor_parallel = g
    Attention, SwiGLU = tp.Attention, tp.SwiGLU
    self:add("tok_embeddings", tp.VocabParallelEmbedding(c.vocab_size, c.dim,
                                                         { std = std, group = g }))
  else
    self:add("tok_embeddings", nn.Embedding(c.vocab_size, c.dim, { std = std }))
  end
  self:add("layers", nn.ModuleList())
  for _ = 1, c.n_layers do
    self.layers:append(nn.TransformerBlock {
      { "attention_norm", nn.RMSNorm(c.dim, c.norm_eps) },
      { "attention", Attention { dim = c.dim, n_heads = c.n_heads,
                                 n_kv_heads = c.n_kv_heads, rope_theta = c.rope_theta,
                                 std = std, out_std = out_std, group = g or cpg } },
      { "ffn_norm", nn.RMSNorm(c.dim, c.norm_eps) },
      { "feed_forward", SwiGLU { dim = c.dim, hidden = c.ffn_hidden, std = std,
                                 out_std = out_std, group = g } },
    })
  end
  self:add("norm", nn.RMSNorm(c.dim, c.norm_eps))
  if not c.tie_embeddings then
    self:add("output", g and tp.ColumnParallelLinear(c.dim, c.vocab_size,
                                                     { std = std, group = g })
                       or nn.Linear(c.dim, c.vocab_size, { std = std }))
  end
end

-- ids: (B, T) int -> logits: (B, T, vocab_size); under tensor parallelism this rank's
-- vocabulary columns (B, T, vocab_size / tp), from self.tok_embeddings.vocab_start.
-- positions: (T) i64, the positions of ids in their sequences (context parallelism:
-- this rank's chunks); nil for 0..T-1.
function Llama:forward(ids, positions)
  local x = self:embed(ids)
  local h = self.layers(x, positions)
  F.free(x)
  local logits = self:head(h)
  F.free(h)
  return logits
end

-- The two ends of forward, which pipeline stages (tetra.parallel.pipeline) run apart:
-- embed on the first stage, head on the last, the blocks of self.layers in between.
-- ids (B, T) -> (B, T, dim).
function Llama:embed(ids)
  return self.tok_embeddings(ids)
end

-- h (B, T, dim), the last block's output -> logits (as forward's).
function Llama:head(h)
  local n = self.norm(h)
  local head = self.output and self.output.weight or self.tok_embeddings.weight
  if self.tensor_parallel then   -- the head is column-parallel (vocabulary rows split)
    local nc = self.tensor_parallel:copy_to_group(n)
    F.free(n)
    n = nc
  end
  local logits = tetra.amp.linear(self, n, head)   -- at train.precision
  F.free(n)
  return logits
end

-- Mean cross-entropy of forward's logits against targets (B, T) (train.loss uses it).
function Llama:cross_entropy(logits, targets)
  if not self.tensor_parallel then return F.cross_entropy(logits, targets) end
  return tetra.parallel.tensor.vocab_parallel_cross_entropy(logits, targets,
    self.tensor_parallel, self.tok_embeddings.vocab_start)
end

-- The full (..., vocab_size) logits from forward's (gathered over the tensor-parallel
-- group; generation uses it).
function Llama:full_logits(logits)
  if not self.tensor_parallel then return logits end
  return self.tensor_parallel:gather_from_group(logits, -1)
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
