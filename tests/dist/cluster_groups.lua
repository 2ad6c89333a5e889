-- Worker for cluster_launch.sh: on a layout of tp 2 x dp 2 x pp 2 (parallel.order from
-- TT_ORDER), prints one line per rank naming its host (the kernel's hostname, which a
-- namespace cluster sets per host) and the world ranks of its tp, dp and pp groups:
--   groups: rank 3 host node2 tp 2,3 dp 1,3 pp 3,7
-- The script checks from these lines where each group landed.
local tetra = require("tetra")
local dist = tetra.dist
local mesh = dist.init({ parallel = { tensor_parallel_size = 2, data_parallel_size = 2,
                                      pipeline_parallel_size = 2,
                                      order = os.getenv("TT_ORDER") or "tp-cp-dp-pp" },
                         dist = { timeout_s = 60 } })
local f = assert(io.open("/proc/sys/kernel/hostname"))
local host = f:read("*l")
f:close()
local function members(group)
  local ranks = {}
  for i = 0, group.size - 1 do ranks[#ranks + 1] = group:world_rank(i) end
  return table.concat(ranks, ",")
end
-- One rank at a time, so the lines do not interleave.
for r = 0, mesh.size - 1 do
  if r == mesh.rank then
    io.stdout:write(string.format("groups: rank %d host %s tp %s dp %s pp %s\n", mesh.rank,
                                  host, members(mesh.tp), members(mesh.dp), members(mesh.pp)))
    io.stdout:flush()
  end
  mesh.world:barrier()
end
