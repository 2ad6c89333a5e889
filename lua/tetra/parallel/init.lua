-- tetra.parallel: one module per parallel dimension, each readable on its own, built on
-- the groups of tetra.dist's mesh.
--   tetra.parallel.data   data parallelism: bucketed gradient averaging overlapped with
--                         backward, ZeRO-1 (lua/tetra/parallel/data.lua)
--   tetra.parallel.tensor Megatron tensor parallelism: column/row-parallel linears,
--                         vocab-parallel embedding and cross-entropy
--                         (lua/tetra/parallel/tensor.lua)
--   tetra.parallel.context context parallelism: sequences cut into 2 cp chunks, K/V
--                         gathered over the cp group in attention
--                         (lua/tetra/parallel/context.lua)
--   tetra.parallel.pipeline pipeline parallelism: blocks split into stages, GPipe and
--                         1F1B schedules over point-to-point send/recv
--                         (lua/tetra/parallel/pipeline.lua)
-- Submodules load on first use.
local parallel = {}

-- Sizes of the four dimensions from cfg.parallel, 1 where unset.
function parallel.layout(cfg)
  local p = (cfg and cfg.parallel) or {}
  return { tp = p.tensor_parallel_size or 1, cp = p.context_parallel_size or 1,
           dp = p.data_parallel_size or 1, pp = p.pipeline_parallel_size or 1 }
end

return setmetatable(parallel, {
  __index = function(t, k)
    local ok, mod = pcall(require, "tetra.parallel." .. k)
    if not ok then
      if tostring(mod):find("module 'tetra.parallel." .. k .. "' not found", 1, true) then
        return nil
      end
      error(mod, 2)
    end
    rawset(t, k, mod)
    return mod
  end,
})
