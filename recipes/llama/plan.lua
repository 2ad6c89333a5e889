-- How tetra.parallel splits model.lua's Llama over the parallel dimensions (the
-- role of torchtitan's parallelize_llama). Paths are module paths; "*" matches one path
-- component. See lua/tetra/parallel/init.lua for the format and tensor.lua for the styles.
return {
  -- Tensor parallelism (Megatron): attention splits its heads, the MLP its hidden units,
  -- the embedding and the head the vocabulary. With parallel.sequence_parallel the norms
  -- run on this rank's slice of the sequence.
  tensor = {
    { "tok_embeddings", "vocab" },
    { "layers.*.attention_norm", "sequence" },
    { "layers.*.attention.wq", "column" },
    { "layers.*.attention.wk", "heads_column" },   -- fewer key/value heads than ranks:
    { "layers.*.attention.wv", "heads_column" },   -- each held by several ranks
    { "layers.*.attention.wo", "row" },
    { "layers.*.ffn_norm", "sequence" },
    { "layers.*.feed_forward.w1", "column" },
    { "layers.*.feed_forward.w3", "column" },
    { "layers.*.feed_forward.w2", "row" },
    { "norm", "sequence" },
    { "output", "vocab_head" },
  },
  -- Context parallelism: attention gathers the keys and values of the other chunks.
  context = { "layers.*.attention" },
  -- Pipeline parallelism: stages divide the blocks; the first keeps the embedding, the
  -- last the final norm and the head.
  pipeline = { blocks = "layers", first = { "tok_embeddings" }, last = { "norm", "output" } },
}
