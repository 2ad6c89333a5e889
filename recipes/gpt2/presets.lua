-- GPT-2's published shapes and what the library must know of model.lua's parameters
-- (tetra.models describes each field).
local M = {}

M.presets = {
  -- GPT-2 small (Radford et al. 2019).
  ["gpt2-124m"] = { dim = 768, n_layers = 12, n_heads = 12, n_kv_heads = 12,
                    vocab_size = 50257, seq_len = 1024, ffn_hidden = 3072, norm_eps = 1e-5,
                    tie_embeddings = true },
  -- GPT-3 175B (Brown et al. 2020, table 2.1: 96 layers, d_model 12288, 96 heads,
  -- context 2048), with GPT-2's vocabulary; the planner's model for 175B-scale plans.
  ["gpt3-175b"] = { dim = 12288, n_layers = 96, n_heads = 96, n_kv_heads = 96,
                    vocab_size = 50257, seq_len = 2048, ffn_hidden = 49152, norm_eps = 1e-5,
                    tie_embeddings = true },
  ["gpt2-tiny"] = { dim = 256, n_layers = 4, n_heads = 4, n_kv_heads = 4,
                    vocab_size = 4096, seq_len = 256, ffn_hidden = 1024, norm_eps = 1e-5,
                    tie_embeddings = true },
}

M.embedding, M.head = "wte", "lm_head"
M.tied = true
M.rotary = false
M.block = { layer_norm = true, out_bias = true, gated_mlp = false, learned_positions = true }

function M.ffn_hidden(dim) return 4 * dim end

-- model.lua's parameters in the order its forward uses them. m: cfg.model.
function M.parameters(m)
  local d, f, V = m.dim, m.ffn_hidden, m.vocab_size
  local dkv = (m.n_kv_heads or m.n_heads) * (d / m.n_heads)
  local out = {}
  local function add(path, name, shape) out[#out + 1] = { path, name, shape } end
  add("wte", "weight", { V, d }); add("wpe", "weight", { m.seq_len, d })
  for i = 0, m.n_layers - 1 do
    local p = "h." .. i
    add(p .. ".ln_1", "weight", { d }); add(p .. ".ln_1", "bias", { d })
    for _, n in ipairs({ "wq", "wk", "wv" }) do
      local rows = n == "wq" and d or dkv
      add(p .. ".attn." .. n, "weight", { rows, d }); add(p .. ".attn." .. n, "bias", { rows })
    end
    add(p .. ".attn.wo", "weight", { d, d }); add(p .. ".attn.wo", "bias", { d })
    add(p .. ".ln_2", "weight", { d }); add(p .. ".ln_2", "bias", { d })
    add(p .. ".mlp.c_fc", "weight", { f, d }); add(p .. ".mlp.c_fc", "bias", { f })
    add(p .. ".mlp.c_proj", "weight", { d, f }); add(p .. ".mlp.c_proj", "bias", { d })
  end
  add("ln_f", "weight", { d }); add("ln_f", "bias", { d })
  add("lm_head", "weight", { V, d })   -- tied: the same matrix as wte
  return out
end

return M
