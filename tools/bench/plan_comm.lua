-- Worker for tools/bench/plan.sh --calibrate (2 ranks): the time of an all-reduce of
-- growing float32 tensors over MPI here, median of 20 each, printed by rank 0 as
-- "allreduce BYTES SECONDS". The cpu cluster's latency_s and intra_bw are a line through
-- these points (a ring all-reduce over n = 2 ranks moves the whole tensor once per rank).
local tetra = require("tetra")
local F = tetra.nn.functional
local mesh = tetra.dist.init({ parallel = { data_parallel_size = 2 }, dist = { timeout_s = 60 } })
local now = require("tetra.obs.metrics").now
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

-- The cost of a blocking collective after computation, beyond the link: ranks reach it
-- at different times, and the first waits for the last. Segments of the same GEMM (about
-- a tensor-parallel block's half on this model: 512 x 256 by 768 x 256), K of them, each
-- followed by a 4-byte all-reduce (as tensor parallelism syncs), against the same K
-- segments with one all-reduce after the last (as data parallelism syncs once a step):
-- the difference per segment, over the segment's time, is what each extra sync costs in
-- waiting. Rounds alternate the two; medians. Printed by rank 0 as
-- "sync SEGMENT_SECONDS EXTRA_SECONDS_PER_SYNC".
local T = tetra.tensor
local x, w = T.randn({ 512, 256 }), T.randn({ 768, 256 })
local flag = F.zeros({ 1 })
local K = 24
local function run(every)
  mesh.world:barrier()
  local t0 = now()
  for i = 1, K do
    F.free(F.linear(x, w))
    if every or i == K then mesh.world:all_reduce(flag, "sum") end
  end
  return now() - t0
end
local function seg()
  local t0 = now()
  F.free(F.linear(x, w))
  return now() - t0
end
local synced, once, segs = {}, {}, {}
for r = 1, 9 do
  synced[r], once[r] = run(true), run(false)
  for _ = 1, 3 do segs[#segs + 1] = seg() end
end
table.sort(synced); table.sort(once); table.sort(segs)
-- each rank's medians, averaged over the ranks
local n = mesh.world.size
local sums = T.from_table({ synced[5] / n, once[5] / n, segs[math.floor(#segs / 2) + 1] / n })
mesh.world:all_reduce(sums, "sum")
local v = sums:tolist()
if mesh.rank == 0 then
  local s, o, g = v[1], v[2], v[3]
  print(string.format("sync %.6e %.6e", g, math.max(0, (s - o) / (K - 1))))
end
