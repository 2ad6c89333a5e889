-- Llama <-> Hugging Face's LlamaForCausalLM: config.json keys and tensor names
-- (tetra.checkpoint.hf reads and writes the folders; the kinds of copy are its own).
local M = {}

M.model_type, M.architecture = "llama", "LlamaForCausalLM"
M.head = "lm_head.weight"                  -- a tied head some writers save anyway
M.buffers = { "%.rotary_emb%.inv_freq$" }  -- recomputed, never read

-- The keys Llama-like config.json files share -> model keys, with the family's defaults
-- where a key is absent (d: seq_len, n_kv_heads (default n_heads), name for messages).
-- get: int(key[, default]), num(key, default, max), refuse(key, bad(value), why),
-- fail(fmt, ...) (prefixed with config.json's path).
function M.llama_keys(c, get, d)
  local m = { dim = get.int("hidden_size"), n_layers = get.int("num_hidden_layers"),
              n_heads = get.int("num_attention_heads"), vocab_size = get.int("vocab_size"),
              ffn_hidden = get.int("intermediate_size"), norm_eps = get.num("rms_norm_eps", 1e-6, 1),
              rope_theta = get.num("rope_theta", 10000, 1e30),
              tie_embeddings = c.tie_word_embeddings == true,
              -- Not a weight's shape: kept for the way back, never imposed on training.
              seq_len = get.int("max_position_embeddings", d.seq_len) }
  m.n_kv_heads = get.int("num_key_value_heads", d.n_kv_heads or m.n_heads)
  get.refuse("hidden_act", function(v) return v ~= "silu" end, "Tetra's " .. d.name .. " uses SiLU")
  get.refuse("rope_scaling", function() return true end, "Tetra's RoPE has no scaling")
  return m
end

-- config.json (c) -> model keys (get: as in M.llama_keys).
function M.from_config(c, get)
  local m = M.llama_keys(c, get, { seq_len = 2048, name = "Llama" })
  get.refuse("attention_bias", function(v) return v ~= false end, "Tetra's Llama has no biases")
  get.refuse("mlp_bias", function(v) return v ~= false end, "Tetra's Llama has no biases")
  M.check_heads(m, get)
  return m
end

-- The attention shape checks Llama-like configs share.
function M.check_heads(m, get)
  get.refuse("head_dim", function(v) return v ~= m.dim / m.n_heads end,
             "Tetra's head size is hidden_size / num_attention_heads")
  if m.dim % m.n_heads ~= 0 or (m.dim / m.n_heads) % 2 ~= 0 then
    get.fail("hidden_size %d over num_attention_heads %d must give an even head size",
             m.dim, m.n_heads)
  end
  if m.n_heads % m.n_kv_heads ~= 0 then
    get.fail("num_key_value_heads %d must divide num_attention_heads %d", m.n_kv_heads,
             m.n_heads)
  end
end

-- Model keys m -> config.json.
function M.to_config(m)
  return { architectures = { M.architecture }, model_type = M.model_type,
           hidden_size = m.dim, intermediate_size = m.ffn_hidden,
           num_attention_heads = m.n_heads, num_hidden_layers = m.n_layers,
           num_key_value_heads = m.n_kv_heads, vocab_size = m.vocab_size,
           max_position_embeddings = m.seq_len, rms_norm_eps = m.norm_eps,
           rope_theta = m.rope_theta, tie_word_embeddings = m.tie_embeddings == true,
           hidden_act = "silu", attention_bias = false, mlp_bias = false,
           initializer_range = m.init_std or 0.02, torch_dtype = "float32" }
end

-- The tensors of model m in Hugging Face's order: add(hf name, kind, { Tetra names },
-- { their shapes }[, heads]). q_proj / k_proj are "rope": Tetra's rotary order is
-- transformers' (rotate-half), Meta's originals are permuted on the way (--rope-layout).
function M.rules(m, add)
  local D, V, Fh, hd = m.dim, m.vocab_size, m.ffn_hidden, m.dim / m.n_heads
  local q, kv = m.n_heads * hd, m.n_kv_heads * hd
  add("model.embed_tokens.weight", "copy", { "tok_embeddings.weight" }, { { V, D } })
  for i = 0, m.n_layers - 1 do
    local h, p = "model.layers." .. i .. ".", "layers." .. i .. "."
    add(h .. "self_attn.q_proj.weight", "rope", { p .. "attention.wq.weight" }, { { q, D } }, m.n_heads)
    add(h .. "self_attn.k_proj.weight", "rope", { p .. "attention.wk.weight" }, { { kv, D } }, m.n_kv_heads)
    add(h .. "self_attn.v_proj.weight", "copy", { p .. "attention.wv.weight" }, { { kv, D } })
    add(h .. "self_attn.o_proj.weight", "copy", { p .. "attention.wo.weight" }, { { D, q } })
    add(h .. "mlp.gate_proj.weight", "copy", { p .. "feed_forward.w1.weight" }, { { Fh, D } })
    add(h .. "mlp.up_proj.weight", "copy", { p .. "feed_forward.w3.weight" }, { { Fh, D } })
    add(h .. "mlp.down_proj.weight", "copy", { p .. "feed_forward.w2.weight" }, { { D, Fh } })
    add(h .. "input_layernorm.weight", "copy", { p .. "attention_norm.weight" }, { { D } })
    add(h .. "post_attention_layernorm.weight", "copy", { p .. "ffn_norm.weight" }, { { D } })
  end
  add("model.norm.weight", "copy", { "norm.weight" }, { { D } })
  if not m.tie_embeddings then add("lm_head.weight", "copy", { "output.weight" }, { { V, D } }) end
end

return M
