-- Configuration keys of activation recompute (train.recompute), read by
-- lua/tetra/nn/recompute.lua through tetra.train's setup.
local config = require("tetra.config.registry")

-- A re-run FP8 forward would quantise with the scales its first run moved and record its
-- amaxes a second time: refused rather than run with different numbers.
config.register_check(function(cfg)
  local t = cfg.train or {}
  if (t.recompute or "none") ~= "none" and t.precision == "fp8" then
    config.error("train.recompute=%s does not combine with train.precision=fp8 (the re-run " ..
                 "forward would move the FP8 amax histories twice): use bf16 or fp16, or " ..
                 "train.recompute=none", tostring(t.recompute))
  end
end)

return {
  train = {
    recompute = { type = "enum", default = "none", values = { "none", "full" },
                  doc = "activation recompute: full keeps only each checkpointed block's " ..
                        "input and re-runs its forward in backward (same loss and " ..
                        "gradients, less memory; docs/parallelism.md)" },
    recompute_every = { type = "int", default = 1, min = 1,
                        doc = "recompute: checkpoint the blocks whose index is a multiple " ..
                              "of N (1: every block, 2: every other one)" },
  },
}
