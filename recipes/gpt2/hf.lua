-- GPT-2 <-> Hugging Face's GPT2LMHeadModel: config.json keys and tensor names
-- (tetra.checkpoint.hf reads and writes the folders; the kinds of copy are its own).
local M = {}

M.model_type, M.architecture = "gpt2", "GPT2LMHeadModel"
M.head = "lm_head.weight"   -- the tied head, saved anyway by some writers
-- The causal masks older transformers versions saved: recomputed, never read.
M.buffers = { "^h%.%d+%.attn%.bias$", "^h%.%d+%.attn%.masked_bias$",
              "^transformer%.h%.%d+%.attn%.bias$", "^transformer%.h%.%d+%.attn%.masked_bias$" }

-- config.json (c) -> model keys; get as in recipes/llama/hf.lua.
function M.from_config(c, get)
  local m = { dim = get.int("n_embd"), n_layers = get.int("n_layer"),
              n_heads = get.int("n_head"), vocab_size = get.int("vocab_size"),
              seq_len = get.int("n_positions"), norm_eps = get.num("layer_norm_epsilon", 1e-5, 1),
              tie_embeddings = true }
  m.n_kv_heads = m.n_heads
  m.ffn_hidden = get.int("n_inner", 4 * m.dim)
  get.refuse("activation_function", function(v) return v ~= "gelu_new" and v ~= "gelu_pytorch_tanh" end,
             "Tetra's GPT-2 uses the tanh GELU (gelu_new)")
  get.refuse("tie_word_embeddings", function(v) return v ~= true end,
             "Tetra's GPT-2 ties lm_head to wte")
  get.refuse("scale_attn_by_inverse_layer_idx", function(v) return v ~= false end,
             "Tetra's attention scales by 1/sqrt(head size) only")
  get.refuse("scale_attn_weights", function(v) return v ~= true end,
             "Tetra's attention scales by 1/sqrt(head size)")
  if m.dim % m.n_heads ~= 0 then
    get.fail("n_head %d must divide n_embd %d", m.n_heads, m.dim)
  end
  return m
end

-- Model keys m -> config.json.
function M.to_config(m)
  return { architectures = { M.architecture }, model_type = M.model_type, n_embd = m.dim,
           n_layer = m.n_layers, n_head = m.n_heads, n_positions = m.seq_len,
           n_ctx = m.seq_len, vocab_size = m.vocab_size, n_inner = m.ffn_hidden,
           activation_function = "gelu_new", layer_norm_epsilon = m.norm_eps,
           tie_word_embeddings = true, initializer_range = m.init_std or 0.02,
           torch_dtype = "float32" }
end

-- The tensors of model m in Hugging Face's order (add as in recipes/llama/hf.lua).
-- GPT-2's Conv1D layers store weights as (in, out) ("t"); c_attn fuses q, k, v ("qkv",
-- its bias "cat"). names: the folder's tensor names when reading one: GPT2LMHeadModel
-- writes "transformer.wte.weight", the original GPT-2 files "wte.weight".
function M.rules(m, add, names)
  local D, V, Fh = m.dim, m.vocab_size, m.ffn_hidden
  local t = (names and not names["transformer.wte.weight"] and names["wte.weight"]) and "" or
            "transformer."
  add(t .. "wte.weight", "copy", { "wte.weight" }, { { V, D } })
  add(t .. "wpe.weight", "copy", { "wpe.weight" }, { { m.seq_len, D } })
  for i = 0, m.n_layers - 1 do
    local h, p = t .. "h." .. i .. ".", "h." .. i .. "."
    for _, ln in ipairs({ "ln_1", "ln_2" }) do
      add(h .. ln .. ".weight", "copy", { p .. ln .. ".weight" }, { { D } })
      add(h .. ln .. ".bias", "copy", { p .. ln .. ".bias" }, { { D } })
    end
    local a = p .. "attn."
    add(h .. "attn.c_attn.weight", "qkv", { a .. "wq.weight", a .. "wk.weight", a .. "wv.weight" },
        { { D, D }, { D, D }, { D, D } })
    add(h .. "attn.c_attn.bias", "cat", { a .. "wq.bias", a .. "wk.bias", a .. "wv.bias" },
        { { D }, { D }, { D } })
    add(h .. "attn.c_proj.weight", "t", { a .. "wo.weight" }, { { D, D } })
    add(h .. "attn.c_proj.bias", "copy", { a .. "wo.bias" }, { { D } })
    add(h .. "mlp.c_fc.weight", "t", { p .. "mlp.c_fc.weight" }, { { Fh, D } })
    add(h .. "mlp.c_fc.bias", "copy", { p .. "mlp.c_fc.bias" }, { { Fh } })
    add(h .. "mlp.c_proj.weight", "t", { p .. "mlp.c_proj.weight" }, { { D, Fh } })
    add(h .. "mlp.c_proj.bias", "copy", { p .. "mlp.c_proj.bias" }, { { D } })
  end
  add(t .. "ln_f.weight", "copy", { "ln_f.weight" }, { { D } })
  add(t .. "ln_f.bias", "copy", { "ln_f.bias" }, { { D } })
end

return M
