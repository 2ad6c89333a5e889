-- Configuration key of CUDA graph replay of the training step (train.cuda_graphs).
-- tetra.config loads every file of this folder: each returns { section = { key = spec } }.
--
-- The engine can capture and replay work (tt_cuda_graph_* in engine/tetra_cuda.h; the
-- optimizer half of a step is captured and replayed in tests/cuda/test_step.c), but the
-- whole step is not captured yet: the caching allocator has no private pool for a graph
-- (blocks freed during the capture would be handed to other tensors while the graph
-- still writes them), and the step still waits for the device for its timing breakdown
-- and its loss. So the key is refused with the reason until that is built and verified
-- on a GPU.
local config = require("tetra.config")

config.register_check(function(cfg)
  local t = cfg.train
  if not (t and t.cuda_graphs) then return end
  local device = tostring(t.device or "cpu")
  if not device:match("^cuda") then
    config.error("train.cuda_graphs replays GPU work and needs train.device=cuda (this run " ..
                 "is on %s): drop train.cuda_graphs", device)
  end
  local p = cfg.parallel or {}
  if (p.pipeline_parallel_size or 1) > 1 or (p.tensor_parallel_size or 1) > 1 or
     (p.context_parallel_size or 1) > 1 then
    config.error("train.cuda_graphs can capture single-process or data-parallel steps only " ..
                 "(this layout has tensor, pipeline or context parallelism): set " ..
                 "train.cuda_graphs=false")
  end
  config.error("train.cuda_graphs: capturing the training step is not built yet (the " ..
               "allocator has no capture pool; the step still waits for the device for " ..
               "its timings and loss): set train.cuda_graphs=false")
end)

return {
  train = {
    cuda_graphs = { type = "bool", default = false,
                    doc = "capture the training step in a CUDA graph and replay it " ..
                          "(refused for now: see lua/tetra/schema/cuda_graphs.lua)" },
  },
}
