-- Configuration key of CUDA graph replay of the training step (train.cuda_graphs).
-- tetra.config loads every file of this folder: each returns { section = { key = spec } }.
--
-- With train.cuda_graphs, tetra.train runs two eager steps, then captures the next step's
-- forward, backward and AdamW update into one CUDA graph (tetra.train.graph: its memory from a
-- private allocator pool, the batch read from a static input tensor, the learning rate
-- and bias corrections read from the optimizer's stats) and replays it every step after.
-- What the captured step cannot hold is refused here with the reason:
--   - collectives: the gradient reducer polls its transfers (NCCL events) from
--     the host (tt_comm_test) to overlap them, which a capture refuses, so only
--     single-process runs (every parallel size 1);
--   - SGD takes its learning rate as a kernel argument (AdamW reads it from its stats);
--   - train.inject_nan_step poisons chosen steps from the host.
-- (The loss guard's spike limit and fp16's loss scale are written into the stats before
-- each step, like the learning rate, and read there: a spike check and fp16 can be
-- captured. fp8's scales, amax histories and their updates live on the device,
-- engine/cuda/fp8_linear.cu, and the two eager steps give every history its first entry,
-- after which no FP8 layer reads a host value: fp8 can be captured.)
local config = require("tetra.config.registry")

local function refuse(why, fix)
  config.error("train.cuda_graphs: %s; %s, or set train.cuda_graphs=false", why, fix)
end

-- (tetra.train runs it again for a config built in code: config.run_check)
config.register_check(function(cfg)
  local t = cfg.train
  if not (t and t.cuda_graphs) then return end
  local device = tostring(t.device or "cpu")
  if not device:match("^cuda") then
    config.error("train.cuda_graphs replays GPU work and needs train.device=cuda (this run " ..
                 "is on %s): drop train.cuda_graphs", device)
  end
  local p = cfg.parallel or {}
  for _, key in ipairs({ "data_parallel_size", "tensor_parallel_size",
                         "pipeline_parallel_size", "context_parallel_size" }) do
    if (p[key] or 1) > 1 then
      refuse(string.format("parallel.%s=%d: collectives are polled from the host and " ..
                           "cannot be captured yet (single-process runs only)", key, p[key]),
             "run one process")
    end
  end
  if cfg.optim and cfg.optim.name == "sgd" then
    refuse("optim.name=sgd takes its learning rate as a kernel argument",
           "use optim.name=adamw")
  end
  if (t.inject_nan_step or 0) > 0 then
    refuse("train.inject_nan_step poisons steps from the host", "drop train.inject_nan_step")
  end
end, "cuda_graphs")

return {
  train = {
    cuda_graphs = { type = "bool", default = false,
                    doc = "after two eager steps, capture the training step (forward, " ..
                          "backward, AdamW update) in one CUDA graph and replay it: " ..
                          "single-process CUDA runs (see " ..
                          "lua/tetra/config/schema/cuda_graphs.lua)" },
  },
}
