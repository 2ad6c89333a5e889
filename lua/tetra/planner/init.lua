-- tetra.planner: what a parallel layout will cost before it runs. For a model (cfg.model), a
-- global batch (cfg.train.batch_size sequences of cfg.model.seq_len tokens) and a cluster,
-- it predicts every rank's memory and the step time of each layout, and ranks them.
--
-- Its parts: cluster (devices and links), model (parameters, matmuls, FLOPs as the plan
-- slices them), layouts (what layouts exist), schedule (the pipeline replay), cost (one
-- layout's price); this module searches, ranks and writes the result out.
--
--   local plan = require("tetra.planner")
--   local cl = plan.cluster("h100", { nodes = 4 })
--   local rows = plan.search(cfg, cl)             -- every valid layout, best first
--   local r = plan.evaluate(cfg, layout, cl)      -- one layout
--   plan.yaml(cfg, r)                             -- that layout as a config for tetra run
--
-- Memory is the engine's own accounting, not a rule of thumb:
--   * parameters come from the model's shapes (the module paths its model.lua builds, as
--     recipes/<family>/presets.lua lists them) sliced by its plan (plan.lua) with the
--     styles and part sizes of tetra.parallel.tensor, and kept per pipeline stage as
--     tetra.parallel.pipeline splits the blocks;
--   * activations are every tensor a block's forward makes, since the autograd tape
--     retains each op's inputs and output until backward (engine/core/autograd.c), with the
--     copies tensor parallelism adds, times the micro-batches a stage holds at once
--     under the engine's own pipeline schedule (tetra.parallel.pipeline.schedule,
--     replayed here), plus the gradients alive when backward starts;
--   * every tensor is rounded to the caching allocator's size class
--     (tt_alloc_granted_bytes), which is what the metrics' peak_bytes counts.
-- Step time is a roofline of the same work: matmul FLOPs at the device's matmul rate,
-- attention FLOPs at its attention rate, elementwise traffic at its memory bandwidth,
-- all times one sustained fraction (the share of those kernel rates a whole training step
-- reaches: launch gaps, small kernels, the loader), plus communication from ring
-- collectives over the links each group spans, the pipeline's bubble from the same
-- schedule replay, and the optimizer. What computation hides is not counted: Tetra's
-- tensor- and context-parallel collectives block (exposed); the data-parallel reduction
-- overlaps the last micro-batch's backward (the last bucket stays exposed, the embedding's
-- hidden by the deferred weight gradients); ZeRO-1's
-- parameter all-gather after the optimizer is exposed. Full and selective activation
-- recompute are what the engine does with train.recompute (docs/parallelism.md);
-- torchtitan's per-op selective policy (selective_op), FP8 matmuls (opts of M.layouts)
-- and eager elementwise kernels (cluster.elementwise = "eager") are priced only to
-- compare published runs that used them: Tetra's engine does none of these.
local models = require("tetra.models")
local cluster = require("tetra.planner.cluster")
local model = require("tetra.planner.model")
local layouts = require("tetra.planner.layouts")
local schedule = require("tetra.planner.schedule")
local cost = require("tetra.planner.cost")

local M = {}

M.clusters, M.cluster = cluster.clusters, cluster.cluster
M.parameters, M.model_plan = model.parameters, model.model_plan
M.flops_per_token, M.parameter_count = model.flops_per_token, model.parameter_count
M.layout_of, M.with_layout, M.layouts = layouts.layout_of, layouts.with_layout, layouts.layouts
M.replay, M.evaluate = schedule.replay, cost.evaluate

-- -- Search -------------------------------------------------------------------------------

-- Evaluates every layout (M.layouts) and ranks them: those that fit first, then by
-- tokens/s (then by memory). Optimizer offload (parallel.offload_optimizer) is weighed
-- where it can help: on a cluster whose devices are not the host (GPUs), a layout that
-- does not fit is weighed again with the AdamW moments in host memory, and kept when that
-- fits (not with optim.name=sgd or train.cuda_graphs, which offload cannot go with).
function M.search(cfg, cl, opts)
  local rows = {}
  if cl.precision == "fp8" then
    -- FP8 GEMMs at the cluster's FP8 rate.
    local o = {}
    for k, v in pairs(opts or {}) do o[k] = v end
    o.fp8 = true
    opts = o
  end
  local t, o = cfg.train or {}, cfg.optim or {}
  local can_offload = not cl.host_is_device and o.name ~= "sgd" and not t.cuda_graphs
  for _, lay in ipairs(M.layouts(cfg, cl, opts)) do
    local r = M.evaluate(cfg, lay, cl)
    rows[#rows + 1] = r
    if can_offload and not r.fits and not lay.offload then
      local off = {}
      for k, v in pairs(lay) do off[k] = v end
      off.offload = true
      local ro = M.evaluate(cfg, off, cl)
      if ro.fits then rows[#rows + 1] = ro end
    end
  end
  table.sort(rows, function(a, b)
    if a.fits ~= b.fits then return a.fits end
    if math.abs(a.tokens_per_s - b.tokens_per_s) > 1e-9 * b.tokens_per_s then
      return a.tokens_per_s > b.tokens_per_s
    end
    return a.mem.total < b.mem.total
  end)
  return rows
end

-- -- Output ------------------------------------------------------------------------------

-- The `parallel.*` and `train.*` settings of record r, as --set key=value strings.
function M.settings(r)
  local s = {
    "parallel.data_parallel_size=" .. r.dp, "parallel.tensor_parallel_size=" .. r.tp,
    "parallel.pipeline_parallel_size=" .. r.pp, "parallel.context_parallel_size=" .. r.cp,
    "parallel.zero_stage=" .. r.zero_stage,
    "parallel.sequence_parallel=" .. tostring(r.sequence_parallel),
    "train.gradient_accumulation_steps=" .. r.grad_accum,
  }
  if r.recompute and r.recompute ~= "none" then s[#s + 1] = "train.recompute=" .. r.recompute end
  if r.offload then s[#s + 1] = "parallel.offload_optimizer=true" end
  if r.pp > 1 then
    s[#s + 1] = "parallel.pipeline_schedule=" .. r.schedule
    if r.virtual > 1 then s[#s + 1] = "parallel.virtual_pipeline_size=" .. r.virtual end
  end
  return s
end

-- A YAML config for `tetra run` with cfg's model and batch and record r's layout.
function M.yaml(cfg, r, cl)
  local m, t = cfg.model, cfg.train
  local lines = {
    string.format("# tetra plan: %d ranks on %s", r.world, cl.name),
    string.format("# predicted: %.3f s/step, %.0f tokens/s, MFU %.1f%%, %.2f GiB per rank",
                  r.step_s, r.tokens_per_s, 100 * r.mfu, r.mem_gib),
    string.format("# run: mpirun -np %d tetra run THIS_FILE.yaml", r.world),
    "model:",
  }
  if not r.fits then
    table.insert(lines, 3, string.format("# WARNING: needs %.2f GiB per rank, more than the " ..
                                         "%.2f GiB a device has", r.mem_gib, cl.mem_bytes / 2 ^ 30))
  end
  local keys = {}
  for k in pairs(m) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v = m[k]
    if type(v) == "number" or type(v) == "boolean" or type(v) == "string" then
      lines[#lines + 1] = string.format("  %s: %s", k, tostring(v))
    end
  end
  lines[#lines + 1] = "train:"
  lines[#lines + 1] = "  recipe: " .. models.of(m).name
  lines[#lines + 1] = "  batch_size: " .. t.batch_size
  lines[#lines + 1] = "  gradient_accumulation_steps: " .. r.grad_accum
  lines[#lines + 1] = "  precision: " .. (cl.precision or t.precision or "fp32")
  if r.recompute and r.recompute ~= "none" then
    lines[#lines + 1] = "  recompute: " .. r.recompute
  end
  lines[#lines + 1] = "parallel:"
  lines[#lines + 1] = "  data_parallel_size: " .. r.dp
  lines[#lines + 1] = "  tensor_parallel_size: " .. r.tp
  lines[#lines + 1] = "  pipeline_parallel_size: " .. r.pp
  lines[#lines + 1] = "  context_parallel_size: " .. r.cp
  lines[#lines + 1] = "  zero_stage: " .. r.zero_stage
  lines[#lines + 1] = "  sequence_parallel: " .. tostring(r.sequence_parallel)
  if r.offload then lines[#lines + 1] = "  offload_optimizer: true" end
  if r.pp > 1 then
    lines[#lines + 1] = "  pipeline_schedule: " .. r.schedule
    lines[#lines + 1] = "  virtual_pipeline_size: " .. r.virtual
  end
  return table.concat(lines, "\n") .. "\n"
end

return M
