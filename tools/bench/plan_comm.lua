-- Worker for tools/bench/plan.sh --calibrate (2 ranks): the time of an all-reduce of
-- growing float32 tensors over MPI here, median of 20 each, printed by rank 0 as
-- "allreduce BYTES SECONDS". The cpu cluster's latency_s and intra_bw are a line through
-- these points (a ring all-reduce over n = 2 ranks moves the whole tensor once per rank).
local tetra = require("tetra")
local F = tetra.nn.functional
local mesh = tetra.dist.init({ parallel = { data_parallel_size = 2 }, dist = { timeout_s = 60 } })
local now = require("tetra.metrics").now
for _, n in ipairs({ 1024, 16384, 262144, 1048576, 4194304 }) do
  local t = F.zeros({ n })
  local times = {}
  for i = 1, 23 do
    mesh.world:barrier()
    local t0 = now()
    mesh.world:all_reduce(t, "sum")
    if i > 3 then times[#times + 1] = now() - t0 end
  end
  table.sort(times)
  if mesh.rank == 0 then print(string.format("allreduce %d %.6e", 4 * n, times[10])) end
  F.free(t)
end
