-- Worker for mesh_groups.sh (4 ranks, tp = 2, dp = 2): checks the groups of the mesh,
-- Lua collectives, async handles and a differentiable collective against values
-- computed from the ranks. Exits non-zero (aborting the job) on the first mismatch.
local tetra = require("tetra")
local dist = tetra.dist
local order = os.getenv("TT_ORDER") or "tp-cp-dp-pp"
local mesh = dist.init({ parallel = { tensor_parallel_size = 2, data_parallel_size = 2,
                                      order = order }, dist = { timeout_s = 60 } })
local r = mesh.rank
local function expect(cond, what)
  if not cond then error(string.format("rank %d: %s (order %s)", r, what, order), 0) end
end
local tp_fast = order == "tp-cp-dp-pp"
local tp_rank = tp_fast and r % 2 or (r >= 2 and 1 or 0)
expect(mesh.size == 4 and mesh.tp.size == 2 and mesh.dp.size == 2 and mesh.pp.size == 1,
       "group sizes")
expect(mesh.tp.rank == tp_rank, "tp rank " .. mesh.tp.rank)
expect(mesh.coords.tp == tp_rank and mesh:rank_at(mesh.coords) == r, "coords")
-- The sum of world ranks over my tp group: partners are r xor 1 (tp fastest) or r +- 2.
local partner = tp_fast and (r % 2 == 0 and r + 1 or r - 1) or (r >= 2 and r - 2 or r + 2)
local s = mesh.tp:all_reduce(tetra.from_table({ r, 1 }), "sum"):tolist()
expect(s[1] == r + partner and s[2] == 2, "tp all_reduce " .. s[1])
local mx = mesh.world:all_reduce(tetra.from_table({ r }), "max"):tolist()
expect(mx[1] == 3, "world max")
local h = mesh.dp:all_gather_async(tetra.from_table({ { r, 10 * r } }), 0)
local g = h:wait():tolist()
expect(#g == 2 and g[1][1] == mesh.dp:world_rank(0) and g[2][2] == 10 * mesh.dp:world_rank(1),
       "dp all_gather")
-- copy_to_group: identity forward, all-reduce of the gradient backward.
local x = tetra.from_table({ 1, 2, 3 }):requires_grad_()
local y = mesh.tp:copy_to_group(x)
local w = tetra.from_table({ r + 1, r + 1, r + 1 })
local loss = (y * w):sum()
loss:backward()
expect(x.grad:tolist()[2] == (r + 1) + (partner + 1), "copy_to_group gradient")
-- Its forward is a view of x (one process reads x itself: a copy of an activation was
-- held until backward), and a weight's bf16 copy is x's, not cast again.
local C, ffi = require("tetra.ffi").C, require("ffi")
require("tetra.ffi").cdef_header("tetra_amp.h")
expect(C.tt_tensor_data(y) == C.tt_tensor_data(x), "copy_to_group copied its input")
local wt = tetra.from_table({ { 1, 2 }, { 3, 4 } })
local lp = ffi.new("tt_tensor *[1]")
assert(C.tt_lowp_weight(wt, C.TT_BF16, lp) == 0)
C.tt_tensor_release(lp[0])
local casts = tonumber(C.tt_lowp_weight_casts())
local wy = mesh.tp:copy_to_group(wt)
assert(C.tt_lowp_weight(wy, C.TT_BF16, lp) == 0)
C.tt_tensor_release(lp[0])
expect(tonumber(C.tt_lowp_weight_casts()) == casts, "copy_to_group's weight was cast again")
expect(math.abs(mesh.world:mean(r + 0.1) - 1.6) < 1e-12, "mean")
if r == 0 then print("mesh_groups: ok (" .. order .. ")") end
