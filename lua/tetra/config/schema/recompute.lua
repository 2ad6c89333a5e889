-- Configuration keys of activation recompute (train.recompute), read by
-- lua/tetra/nn/recompute.lua through tetra.train's setup.
local config = require("tetra.config.registry")

-- A re-run FP8 forward must quantise with the scales its first run used: the CPU
-- emulation stashes them (engine/ops/fp8.c), the CUDA GEMMs keep theirs on the device
-- and have no stash yet. Refused there rather than run with other numbers.
config.register_check(function(cfg)
  local t = cfg.train or {}
  if (t.recompute or "none") ~= "none" and t.precision == "fp8" and
     tostring(t.device):match("^cuda") then
    config.error("train.recompute=%s with train.precision=fp8 runs on the CPU only (the " ..
                 "CUDA FP8 GEMMs keep their scales on the device, with nothing for the " ..
                 "re-run to replay): use bf16 or train.recompute=none on cuda",
                 tostring(t.recompute))
  end
end)

-- Selective recompute keeps and takes back the outputs of the GEMM entry points of
-- engine/ops/matmul.c and engine/cuda/matmul_lowp.cu (fp32 and bf16 / fp16 on both
-- devices); fp8 with recompute stays CPU only (above).
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
