-- Configuration key of optimizer offload (parallel.offload_optimizer), read by
-- tetra.train's setup (AdamW:offload_state, lua/tetra/optim/init.lua).
local config = require("tetra.config.registry")

-- What offload cannot go with: an optimizer without moments, and a captured step (the
-- update runs on the CPU, outside any CUDA graph).
config.register_check(function(cfg)
  local p, t, o = cfg.parallel or {}, cfg.train or {}, cfg.optim or {}
  if not p.offload_optimizer then return end
  if o.name == "sgd" then
    config.error("parallel.offload_optimizer offloads AdamW's moments: optim.name=sgd has " ..
                 "none (use AdamW, or set parallel.offload_optimizer=false)")
  end
  if t.cuda_graphs then
    config.error("parallel.offload_optimizer runs the update on the CPU, which a CUDA graph " ..
                 "cannot capture: set train.cuda_graphs=false or parallel.offload_optimizer=false")
  end
end)

return {
  parallel = {
    offload_optimizer = { type = "bool", default = false,
                          doc = "keep the AdamW moments in host memory and run the update " ..
                                "on the CPU (two parameter-sized f32 tensors less on the " ..
                                "device; under bf16 / fp16 the f32 masters too, through " ..
                                "forward and backward: the matrices', or under ZeRO-3 " ..
                                "this rank's shares; " ..
                                "docs/parallelism.md)" },
  },
}
