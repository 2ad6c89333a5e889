-- Configuration keys of activation recompute (train.recompute), read by
-- lua/tetra/nn/recompute.lua through tetra.train's setup.

-- Selective recompute keeps and takes back the outputs of the GEMM entry points of
-- engine/ops/matmul.c and engine/cuda/matmul_lowp.cu (fp32 and bf16 / fp16 on both
-- devices). An FP8 layer's re-run quantises with the scales its first run used, on both
-- devices (engine/ops/fp8.c, engine/cuda/fp8_linear.cu).
return {
  train = {
    recompute = { type = "enum", default = "none", values = { "none", "selective", "full" },
                  doc = "activation recompute: full keeps only each checkpointed block's " ..
                        "input and re-runs its forward in backward; selective also keeps " ..
                        "its GEMM outputs and re-runs the rest (norms, RoPE, attention's " ..
                        "core, activations); same loss and gradients, less memory " ..
                        "(docs/parallelism.md)" },
    recompute_every = { type = "int", default = 1, min = 1,
                        doc = "recompute: checkpoint the blocks whose index is a multiple " ..
                              "of N (1: every block, 2: every other one)" },
  },
}
