-- How tetra.parallel splits model.lua's GPT2 over the parallel dimensions. Paths
-- are module paths; "*" matches one path component. See lua/tetra/parallel/init.lua for
-- the format and tensor.lua for the styles.
return {
  -- Tensor parallelism (Megatron): attention splits its heads (q, k, v biases with them),
  -- the MLP its hidden units, the token embedding and the tied head the vocabulary. With
  -- parallel.sequence_parallel the LayerNorms run on this rank's slice of the sequence
  -- and the learned positions keep that slice of their output.
  tensor = {
    { "wte", "vocab" },
    { "wpe", "sequence_output" },
    { "h.*.ln_1", "sequence" },
    { "h.*.attn.wq", "column" },
    { "h.*.attn.wk", "heads_column" },
    { "h.*.attn.wv", "heads_column" },
    { "h.*.attn.wo", "row" },
    { "h.*.ln_2", "sequence" },
    { "h.*.mlp.c_fc", "column" },
    { "h.*.mlp.c_proj", "row" },
    { "ln_f", "sequence" },
    { "lm_head", "vocab_head" },
  },
  -- Context parallelism: attention gathers the keys and values of the other chunks.
  context = { "h.*.attn" },
  -- Pipeline parallelism: stages divide the blocks; the first keeps the embeddings, the
  -- last the final norm and the head (its copy of the tied embedding matrix).
  pipeline = { blocks = "h", first = { "wte", "wpe" }, last = { "ln_f", "lm_head" } },
}
