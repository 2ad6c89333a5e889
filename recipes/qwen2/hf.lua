-- Qwen2 <-> Hugging Face's Qwen2ForCausalLM: Llama's tensor names plus the q_proj,
-- k_proj and v_proj biases, and Qwen2's config.json keys (Qwen2Config).
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local llama = dofile(here .. "/../llama/hf.lua")

local M = {}

M.model_type, M.architecture = "qwen2", "Qwen2ForCausalLM"
M.head, M.buffers = llama.head, llama.buffers

-- config.json (c) -> model keys; get as in recipes/llama/hf.lua. Qwen2Config's defaults
-- where a key is absent.
function M.from_config(c, get)
  local m = llama.llama_keys(c, get, { seq_len = 32768, n_kv_heads = 32, name = "Qwen2" })
  get.refuse("use_sliding_window", function(v) return v ~= false end,
             "Tetra's attention is causal over the whole sequence")
  get.refuse("attention_dropout", function(v) return v ~= 0 end, "Tetra has no dropout")
  llama.check_heads(m, get)
  return m
end

-- Model keys m -> config.json: Llama's keys less its bias switches (Qwen2 has q/k/v
-- biases and no MLP ones, by architecture), plus the sliding window, off, its length the
-- sequence's, so that no version of transformers narrows the attention.
function M.to_config(m)
  local c = llama.to_config(m)
  c.architectures, c.model_type = { M.architecture }, M.model_type
  c.attention_bias, c.mlp_bias = nil, nil
  c.use_sliding_window, c.sliding_window = false, m.seq_len
  c.max_window_layers, c.attention_dropout = m.n_layers, 0
  return c
end

-- Llama's tensors, each q, k, v projection's weight followed by its bias; the q and k
-- biases are reordered with their weights' rows under --rope-layout meta.
function M.rules(m, add, names)
  llama.rules(m, function(hf, kind, tetra, shapes, heads)
    add(hf, kind, tetra, shapes, heads)
    local proj = hf:match("^(.*%.self_attn%.[qkv]_proj%.)weight$")
    if proj then
      add(proj .. "bias", kind, { (tetra[1]:gsub("weight$", "bias")) }, { { shapes[1][1] } }, heads)
    end
  end, names)
end

return M
