-- Llama's published shapes and what the library must know of model.lua's parameters
-- (tetra.models describes each field).
local M = {}

M.presets = {
  -- Llama 2 7B (Touvron et al. 2023).
  ["llama-7b"] = { dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 32,
                   vocab_size = 32000, seq_len = 4096, ffn_hidden = 11008, norm_eps = 1e-5,
                   rope_theta = 10000, tie_embeddings = false },
  -- Llama 3.2 1B.
  ["llama-1b"] = { dim = 2048, n_layers = 16, n_heads = 32, n_kv_heads = 8,
                   vocab_size = 128256, seq_len = 2048, ffn_hidden = 8192, norm_eps = 1e-5,
                   rope_theta = 500000, tie_embeddings = true },
  -- Llama 3.1 8B and 70B (Meta 2024, "The Llama 3 Herd of Models", table 3).
  ["llama3-8b"] = { dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 8,
                    vocab_size = 128256, seq_len = 8192, ffn_hidden = 14336, norm_eps = 1e-5,
                    rope_theta = 500000, tie_embeddings = false },
  ["llama3-70b"] = { dim = 8192, n_layers = 80, n_heads = 64, n_kv_heads = 8,
                     vocab_size = 128256, seq_len = 8192, ffn_hidden = 28672, norm_eps = 1e-5,
                     rope_theta = 500000, tie_embeddings = false },
  -- Llama 3.1 405B (Llama Team 2024, "The Llama 3 Herd of Models", table 3: 126 layers,
  -- model dimension 16,384, FFN 53,248, 128 heads, 8 key/value heads, vocabulary 128K).
  ["llama3-405b"] = { dim = 16384, n_layers = 126, n_heads = 128, n_kv_heads = 8,
                      vocab_size = 128256, seq_len = 8192, ffn_hidden = 53248, norm_eps = 1e-5,
                      rope_theta = 500000, tie_embeddings = false },
  -- The benchmark model: trains in minutes on 2 CPU cores.
  ["llama-tiny"] = { dim = 256, n_layers = 4, n_heads = 4, n_kv_heads = 4,
                     vocab_size = 4096, seq_len = 256, ffn_hidden = 768, norm_eps = 1e-5,
                     rope_theta = 10000, tie_embeddings = false },
}

M.embedding, M.head = "tok_embeddings", "output"
M.rotary = true
M.block = { layer_norm = false, out_bias = false, gated_mlp = true, learned_positions = false }
M.eager_elementwise = true

-- 2/3 of 4 x dim, rounded up to a multiple of 256 (Meta's rule).
function M.ffn_hidden(dim)
  return 256 * math.ceil(math.floor(8 * dim / 3) / 256)
end

-- model.lua's parameters in the order its forward uses them. m: cfg.model.
function M.parameters(m)
  local d, f, V = m.dim, m.ffn_hidden, m.vocab_size
  local dkv = (m.n_kv_heads or m.n_heads) * (d / m.n_heads)
  local out = {}
  local function add(path, name, shape) out[#out + 1] = { path, name, shape } end
  add("tok_embeddings", "weight", { V, d })
  for i = 0, m.n_layers - 1 do
    local p = "layers." .. i
    add(p .. ".attention_norm", "weight", { d })
    add(p .. ".attention.wq", "weight", { d, d })
    add(p .. ".attention.wk", "weight", { dkv, d })
    add(p .. ".attention.wv", "weight", { dkv, d })
    add(p .. ".attention.wo", "weight", { d, d })
    add(p .. ".ffn_norm", "weight", { d })
    add(p .. ".feed_forward.w1", "weight", { f, d })
    add(p .. ".feed_forward.w3", "weight", { f, d })
    add(p .. ".feed_forward.w2", "weight", { d, f })
  end
  add("norm", "weight", { d })
  add("output", "weight", { V, d })
  return out
end

return M
