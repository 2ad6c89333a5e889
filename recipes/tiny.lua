-- A tiny Llama (about 0.1M parameters) on mock tokens: seconds per run, for tests and for
-- checking parallel layouts against the single-process loss curve, e.g.
--   mpirun -n 2 tetra run recipes/tiny.lua --set parallel.data_parallel_size=2 \
--     --set log.metrics_file=dp2.jsonl
-- The model is recipes/llama/model.lua's, with grouped-query attention (4 query heads sharing
-- 2 key/value heads) so that path is exercised too.
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local llama = dofile(here .. "/llama/model.lua")

local train = require("tetra").train

return train.recipe {
  name = "tiny",
  Model = llama.Model,
  plan = llama.plan,
  defaults = {
    model = { vocab_size = 256, dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2,
              ffn_hidden = 128, seq_len = 32, norm_eps = 1e-5, rope_theta = 10000.0,
              tie_embeddings = false, init_std = 0.02 },
    train = { steps = 20, batch_size = 8, lr = 3e-3, min_lr = 3e-4, warmup_steps = 2,
              lr_schedule = "cosine", weight_decay = 0.1, max_grad_norm = 1.0, seed = 0 },
    optim = { name = "adamw", beta1 = 0.9, beta2 = 0.95, eps = 1e-8 },
    data = { mock = true },
  },
}
