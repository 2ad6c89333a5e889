-- Qwen2's published shapes and what the library must know of model.lua's parameters
-- (tetra.models describes each field): Llama's, with the q, k, v biases.
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local llama = dofile(here .. "/../llama/presets.lua")

local M = {}
for k, v in pairs(llama) do M[k] = v end
M.eager_elementwise = nil   -- the eager hand count is torchtitan's Llama's

-- Qwen2 0.5B and 7B (Yang et al. 2024, table 1; the released config.json files).
-- seq_len is the pretraining length of most tokens (4,096; 32,768 at the end).
M.presets = {
  ["qwen2-0.5b"] = { dim = 896, n_layers = 24, n_heads = 14, n_kv_heads = 2,
                     vocab_size = 151936, seq_len = 4096, ffn_hidden = 4864, norm_eps = 1e-6,
                     rope_theta = 1000000, tie_embeddings = true },
  ["qwen2-7b"] = { dim = 3584, n_layers = 28, n_heads = 28, n_kv_heads = 4,
                   vocab_size = 152064, seq_len = 4096, ffn_hidden = 18944, norm_eps = 1e-6,
                   rope_theta = 1000000, tie_embeddings = false },
}

-- Llama's parameters, each q, k, v weight followed by its bias.
function M.parameters(m)
  local out = {}
  for _, e in ipairs(llama.parameters(m)) do
    out[#out + 1] = e
    if e[1]:match("%.attention%.w[qkv]$") then out[#out + 1] = { e[1], "bias", { e[3][1] } } end
  end
  return out
end

return M
