-- Tetra side of tools/bench/dp.sh (run as a recipe: `tetra run THIS_FILE [--set ...]`).
--
-- Trains recipes/llama.lua's model on mock tokens (2 warm-up steps, then train.steps
-- timed steps) and prints one JSON line on rank 0:
--   step_time_s      median time of an optimizer step
--   exposed_comm_s   median time a step spent in ddp:finish_grads waiting for gradient
--                    buckets after backward ended (communication not hidden by overlap)
--   comm_s           time of one blocking all-reduce of every gradient (the whole
--                    communication of a step, had nothing overlapped)
--   exposed_fraction exposed_comm_s / comm_s
--   buckets          how many gradient buckets the reducer made
--   sparse_rows      embedding rows the last step's row exchange moved (-1: the dense
--                    path; dist.sparse_embedding_grad)
--   deferred         parameters whose gradients backward computes after the embedding's
--                    (dist.defer_weight_grads)
local tetra = require("tetra")
local metrics = tetra.metrics
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local llama = dofile(here .. "/../../recipes/llama.lua")

local median = tetra.metrics.median

local function blocking_allreduce_s(env, reps)
  local g = env.mesh.dp
  if g.size == 1 then return 0.0 end
  local flat = tetra.zeros(env.model:num_params())
  local times = {}
  for i = 1, reps do
    g:barrier()
    local t0 = metrics.now()
    g:all_reduce(flat, "avg")
    times[i] = metrics.now() - t0
  end
  return median(times)
end

return {
  name = "bench_dp",
  defaults = llama.defaults,
  run = function(cfg)
    local env = llama.setup(cfg)
    local steps, warmup = cfg.train.steps, 2
    local step_times, exposed = {}, {}
    for i = 1, warmup + steps do
      local rec = env.step()
      if i > warmup then
        step_times[#step_times + 1] = rec.step_time_s
        exposed[#exposed + 1] = env.ddp.exposed_comm_s or 0.0
      end
    end
    local comm = blocking_allreduce_s(env, 5)
    local ex = median(exposed)
    if env.rank == 0 then
      print(string.format('{"ranks":%d,"params":%d,"batch_size":%d,"seq_len":%d,' ..
        '"step_time_s":%.4f,"tokens_per_s":%.0f,"exposed_comm_s":%.4f,"comm_s":%.4f,' ..
        '"exposed_fraction":%.3f,"buckets":%d,"sparse_rows":%d,"deferred":%d}', env.mesh.size, env.model:num_params(),
        cfg.train.batch_size, cfg.model.seq_len, median(step_times),
        cfg.train.batch_size * cfg.model.seq_len / median(step_times), ex, comm,
        comm > 0 and ex / comm or 0.0, env.ddp.num_buckets or 0, env.ddp.sparse_rows or -1,
        env.ddp.deferred))
    end
  end,
}
