-- Worker for cluster_launch.sh: on a layout of tp 2 x dp 2 x pp 2 (parallel.order from
-- TT_ORDER), prints one line per rank naming its host (the kernel's hostname, which a
-- namespace cluster sets per host) and the world ranks of its tp, dp and pp groups:
--   groups: rank 3 host node2 tp 2,3 dp 1,3 pp 3,7
-- The script checks from these lines where each group landed. Each rank also checks the
-- engine's table of every rank's host (gathered at start-up) against those hostnames.
local ffi = require("ffi")
local tetra = require("tetra")
local dist = tetra.dist
local mesh = dist.init({ parallel = { tensor_parallel_size = 2, data_parallel_size = 2,
                                      pipeline_parallel_size = 2,
                                      order = os.getenv("TT_ORDER") or "tp-cp-dp-pp" },
                         dist = { timeout_s = 60 } })
local f = assert(io.open("/proc/sys/kernel/hostname"))
local host = f:read("*l")
f:close()
local hosts = mesh.world:all_gather(tetra.from_table({ tonumber(host:match("%d+$")) }), 0)
for r, number in ipairs(hosts:tolist()) do
  local known = ffi.string(ffi.C.tt_dist_rank_host(r - 1))
  if known ~= "node" .. number then
    error(string.format("rank %d: the engine says rank %d runs on %s, its kernel says node%d",
                        mesh.rank, r - 1, known, number), 0)
  end
end
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
