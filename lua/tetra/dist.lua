-- tetra.dist: processes, groups and collectives.
--
--   local mesh = tetra.dist.init(cfg)     -- the 4D mesh (one process of size 1 without MPI)
--   mesh.rank, mesh.size, mesh.local_rank -- world rank, world size, rank on this node
--   mesh.tp, mesh.cp, mesh.dp, mesh.pp, mesh.dpcp, mesh.world
--                                         -- groups: g.rank, g.size, g.name, collectives
--   g:all_reduce(t, "sum" | "avg" | "max" | "min")   -- in place, returns t
--   g:all_gather(t, dim)  g:reduce_scatter(t, dim, op)  g:broadcast(t, root)
--   g:send(t, dst, tag)   g:recv(t, src, tag)           g:all_to_all(t, split, concat)
--   g:barrier()   g:gather_numbers({ a, b })         -- a few Lua numbers from each member
--   local h = g:all_reduce_async(t); ...; h:wait()  -- every collective has an _async
--                                         -- form; wait() returns the result
--   g:copy_to_group(x) ...                -- differentiable collectives (autograd)
--
-- MPI starts only when mpirun / srun launched the process (or cfg.dist.force_mpi). Each
-- wait has a deadline (cfg.dist.timeout_s, default 600 s): a collective that misses it
-- reports the collective, group and step, then aborts the job.
local ffi = require("ffi")
local tffi = require("tetra.ffi")
tffi.cdef_header("tetra_dist.h")
local tensor = require("tetra.tensor")
local layout = require("tetra.parallel.layout")
local device = require("tetra.device")

local C = ffi.C
local take, pout = tensor.take, tensor.pout

local dist = {}

local function check(status, level)
  if status ~= 0 then error(ffi.string(C.tt_last_error()), level or 3) end
end

local function op_id(op)
  local id = C.tt_reduce_op_from_name(op or "sum")
  if id < 0 then
    error("unknown reduce op '" .. tostring(op) .. "' (sum, avg, max, min)", 3)
  end
  return id
end

-- -- Handles -------------------------------------------------------------------------

local Handle = {}
Handle.__index = Handle

local hbox = ffi.new("tt_comm_handle *[1]")

-- Wraps the handle left in hbox; `result` is what wait() returns.
local function new_handle(status, result)
  check(status, 4)
  local h = ffi.gc(hbox[0], C.tt_comm_handle_free)
  hbox[0] = nil
  return setmetatable({ _h = h, _result = result }, Handle)
end

-- Blocks (under the watchdog deadline) until the operation completed; returns the
-- result tensor (the reduced input, or the new tensor of gathers).
function Handle:wait()
  if not self._done then
    check(C.tt_comm_wait(self._h))
    self._done = true
  end
  return self._result
end

local done_box = ffi.new("int[1]")
-- True once complete (drives progress without blocking).
function Handle:test()
  if self._done then return true end
  check(C.tt_comm_test(self._h, done_box))
  self._done = done_box[0] ~= 0
  return self._done
end

-- -- Groups --------------------------------------------------------------------------

local Group = {}
Group.__index = Group

-- `owner` keeps whatever owns the C group (the mesh) alive as long as the group is used.
local function new_group(ptr, owner)
  return setmetatable({ _c = ptr, _owner = owner, rank = C.tt_comm_rank(ptr),
                        size = C.tt_comm_size(ptr), name = ffi.string(C.tt_comm_name(ptr)) },
                      Group)
end

function Group:__tostring()
  return string.format("group %s (rank %d of %d)", self.name, self.rank, self.size)
end

-- World rank of this group's member `group_rank`.
function Group:world_rank(group_rank)
  return C.tt_comm_world_rank_of(self._c, group_rank)
end

function Group:all_reduce(t, op)
  check(C.tt_comm_all_reduce(self._c, t, op_id(op)))
  return t
end
function Group:all_gather(t, dim)
  return take(C.tt_comm_all_gather(self._c, t, dim or 0, pout))
end
function Group:reduce_scatter(t, dim, op)
  return take(C.tt_comm_reduce_scatter(self._c, t, dim or 0, op_id(op), pout))
end
function Group:broadcast(t, root)
  check(C.tt_comm_broadcast(self._c, t, root or 0))
  return t
end
function Group:send(t, dst, tag) check(C.tt_comm_send(self._c, t, dst, tag or 0)) end
function Group:recv(t, src, tag)
  check(C.tt_comm_recv(self._c, t, src, tag or 0))
  return t
end
function Group:all_to_all(t, split_dim, concat_dim)
  return take(C.tt_comm_all_to_all(self._c, t, split_dim or 0, concat_dim or 0, pout))
end
function Group:barrier() check(C.tt_comm_barrier(self._c)) end

function Group:all_reduce_async(t, op)
  return new_handle(C.tt_comm_all_reduce_async(self._c, t, op_id(op), hbox), t)
end
function Group:all_gather_async(t, dim)
  local status = C.tt_comm_all_gather_async(self._c, t, dim or 0, pout, hbox)
  return new_handle(status, status == 0 and take(0) or nil)
end
function Group:reduce_scatter_async(t, dim, op)
  local status = C.tt_comm_reduce_scatter_async(self._c, t, dim or 0, op_id(op), pout, hbox)
  return new_handle(status, status == 0 and take(0) or nil)
end
function Group:broadcast_async(t, root)
  return new_handle(C.tt_comm_broadcast_async(self._c, t, root or 0, hbox), t)
end
function Group:send_async(t, dst, tag)
  return new_handle(C.tt_comm_send_async(self._c, t, dst, tag or 0, hbox), t)
end
function Group:recv_async(t, src, tag)
  return new_handle(C.tt_comm_recv_async(self._c, t, src, tag or 0, hbox), t)
end
-- A send and a receive that progress together (tt_comm_sendrecv): returns once `recv`
-- holds the data, with the send's handle (wait for it before reusing `send`).
function Group:sendrecv(send, dst, send_tag, recv, src, recv_tag)
  return new_handle(C.tt_comm_sendrecv(self._c, send, dst, send_tag or 0, recv, src,
                                       recv_tag or 0, hbox), send)
end
-- Sends and receives that progress together (tt_comm_p2p; on GPUs one NCCL group):
-- sends and recvs are arrays of { t, peer, tag }. Returns once every receive holds its
-- data, with the sends' handles (wait for them before reusing the tensors).
local p2p_t = ffi.new("tt_tensor *[?]", 2 * C.TT_P2P_MAX)
local p2p_i = ffi.new("int[?]", 4 * C.TT_P2P_MAX)
local p2p_h = ffi.new("tt_comm_handle *[?]", C.TT_P2P_MAX)
function Group:p2p(sends, recvs)
  local ns, nr, max = #sends, #recvs, C.TT_P2P_MAX
  if ns > max or nr > max then
    error(("p2p: %d sends and %d receives, at most %d of each"):format(ns, nr, max), 2)
  end
  local dst, stag, src, rtag = p2p_i, p2p_i + max, p2p_i + 2 * max, p2p_i + 3 * max
  for i, x in ipairs(sends) do
    p2p_t[i - 1], dst[i - 1], stag[i - 1] = x[1], x[2], x[3] or 0
  end
  for i, x in ipairs(recvs) do
    p2p_t[max + i - 1], src[i - 1], rtag[i - 1] = x[1], x[2], x[3] or 0
  end
  check(C.tt_comm_p2p(self._c, ns, p2p_t, dst, stag, nr, p2p_t + max, src, rtag, p2p_h))
  local handles = {}
  for i = 0, ns - 1 do
    if p2p_h[i] ~= nil then
      handles[#handles + 1] = setmetatable({ _h = ffi.gc(p2p_h[i], C.tt_comm_handle_free),
                                             _result = sends[i + 1][1] }, Handle)
      p2p_h[i] = nil
    end
  end
  return handles
end
function Group:all_to_all_async(t, split_dim, concat_dim)
  local status = C.tt_comm_all_to_all_async(self._c, t, split_dim or 0, concat_dim or 0,
                                            pout, hbox)
  return new_handle(status, status == 0 and take(0) or nil)
end
function Group:barrier_async()
  return new_handle(C.tt_comm_barrier_async(self._c, hbox), nil)
end

-- Differentiable collectives (see engine/tetra_dist.h for the conjugate pairs).
function Group:copy_to_group(x) return take(C.tt_dist_copy_to_group(self._c, x, pout)) end
function Group:reduce_from_group(x) return take(C.tt_dist_reduce_from_group(self._c, x, pout)) end
function Group:gather_from_group(x, dim)
  return take(C.tt_dist_gather_from_group(self._c, x, dim or -1, pout))
end
function Group:scatter_to_group(x, dim)
  return take(C.tt_dist_scatter_to_group(self._c, x, dim or -1, pout))
end
function Group:sp_gather(x, dim) return take(C.tt_dist_sp_gather(self._c, x, dim or 0, pout)) end
function Group:sp_reduce_scatter(x, dim)
  return take(C.tt_dist_sp_reduce_scatter(self._c, x, dim or 0, pout))
end

-- Mean of a Lua number over the group. Each double travels as a (hi, lo) pair of floats
-- and is summed here in double precision, so the mean does not round to float.
function Group:mean(x)
  return self:sum(x) / self.size
end

-- Sum of a Lua number over the group, in double precision (as mean).
function Group:sum(x)
  if self.size == 1 then return x end
  local hi = tonumber(ffi.new("float", x))
  local all = take(C.tt_comm_all_gather(self._c, tensor.from_table({ hi, x - hi }), 0, pout),
                   3)
  local sum = 0.0
  for i = 0, 2 * self.size - 1 do sum = sum + C.tt_tensor_get(all, i) end
  return sum
end

-- Lua numbers from every member, as float32: xs (the same count on each) -> { [1] = the
-- first member's xs, ... } in group rank order. One all-gather; for small figures
-- (timings), not for values that need double precision (see sum).
function Group:gather_numbers(xs)
  local n = #xs
  if self.size == 1 then return { xs } end
  local all = take(C.tt_comm_all_gather(self._c, tensor.from_table(xs), 0, pout), 3)
  local out = {}
  for r = 1, self.size do
    local row = {}
    for i = 1, n do row[i] = C.tt_tensor_get(all, (r - 1) * n + i - 1) end
    out[r] = row
  end
  return out
end

-- A new group of the members that pass the same color, ordered by key (collective over
-- this group); name is what messages call it. opts.host_only: its collectives only move
-- CPU tensors, so it gets no NCCL communicator where CUDA tensors travel by NCCL.
function Group:split(color, key, name, opts)
  local box = ffi.new("tt_comm *[1]")
  local make = opts and opts.host_only and C.tt_comm_split_host or C.tt_comm_split
  check(make(self._c, color, key, name, box))
  return new_group(ffi.gc(box[0], C.tt_comm_free), self)
end

-- -- Processes -----------------------------------------------------------------------

-- Starts the process layer (idempotent): MPI when launched by mpirun / srun or `force`.
function dist.start(force, timeout_s)
  check(C.tt_dist_init(force and 1 or 0))
  if timeout_s then C.tt_dist_set_timeout(timeout_s) end
end

-- These start the process layer first, so they are right before dist.init too.
function dist.rank() dist.start() return C.tt_dist_rank() end
function dist.world_size() dist.start() return C.tt_dist_world_size() end
function dist.local_rank() dist.start() return C.tt_dist_local_rank() end
function dist.is_main() return dist.rank() == 0 end
function dist.launched() return C.tt_dist_launched() ~= 0 end
-- The hostname world rank r reported at start-up ("?" when out of range).
function dist.rank_host(r)
  dist.start()
  local h = C.tt_dist_rank_host(r)
  return h ~= nil and ffi.string(h) or "?"
end
-- The world group (every process), started if need be; split it for a private channel.
function dist.world() dist.start() return new_group(C.tt_comm_world(), nil) end
-- The step the watchdog names when a collective hangs.
function dist.set_step(step) C.tt_dist_set_step(step) end

-- Reports an error that every rank hits alike (a bad layout, a bad batch size) once:
-- rank 0 raises it; the others wait for rank 0 to abort the job.
function dist.fail(msg)
  if C.tt_dist_is_initialized() ~= 0 and C.tt_dist_rank() ~= 0 then
    C.tt_dist_await_abort(30)
  end
  error(require("tetra.util.errors").new(msg), 0)
end

-- Prints on rank 0 only.
function dist.print(...)
  if C.tt_dist_rank() == 0 then print(...) end
end

-- -- The mesh ------------------------------------------------------------------------

local Mesh = {}
Mesh.__index = Mesh
local DIMS = { "tp", "cp", "dp", "pp" }

-- World rank of the process at coordinates { tp =, cp =, dp =, pp = } (missing: 0).
function Mesh:rank_at(coords)
  return C.tt_mesh_rank_at(self._m, coords.tp or 0, coords.cp or 0, coords.dp or 0,
                           coords.pp or 0)
end

function Mesh:__tostring()
  local l = self.layout
  return string.format("mesh tp=%d cp=%d dp=%d pp=%d (%s), rank %d of %d", l.tp, l.cp, l.dp,
                       l.pp, self.order, self.rank, self.size)
end

local current

-- Builds the mesh from cfg.parallel.{tensor,context,data,pipeline}_parallel_size (as
-- tetra.parallel.layout reads them) and cfg.parallel.order ("tp-cp-dp-pp", fastest first); sets the watchdog deadline from
-- cfg.dist.timeout_s. Called again with the same layout, returns the same mesh.
function dist.init(cfg)
  cfg = cfg or {}
  local p, d = cfg.parallel or {}, cfg.dist or {}
  local sizes = layout.sizes(cfg)
  local order = p.order or "tp-cp-dp-pp"
  dist.start(d.force_mpi, d.timeout_s or 600)
  if current and current.order == order and current.layout.tp == sizes.tp and
     current.layout.cp == sizes.cp and current.layout.dp == sizes.dp and
     current.layout.pp == sizes.pp then
    return current
  end
  -- CUDA tensors travel by NCCL, whose communicators are made with the groups below,
  -- in the one order every rank makes them (never at a group's first collective), on
  -- this rank's GPU, which tetra.device starts first.
  local dev = cfg.train and cfg.train.device
  if dev and tostring(dev):match("^cuda") and C.tt_dist_world_size() > 1 then
    device.start(dev)
    if C.tt_dist_nccl_enable() ~= 0 then dist.fail(ffi.string(C.tt_last_error())) end
  end
  local box = ffi.new("tt_mesh *[1]")
  if C.tt_mesh_new(sizes.tp, sizes.cp, sizes.dp, sizes.pp, order, box) ~= 0 then
    dist.fail(ffi.string(C.tt_last_error()))
  end
  local mesh = setmetatable({ _m = ffi.gc(box[0], C.tt_mesh_free), layout = sizes,
                              order = order, rank = C.tt_dist_rank(),
                              size = C.tt_dist_world_size(),
                              local_rank = C.tt_dist_local_rank(), coords = {} }, Mesh)
  for _, name in ipairs({ "tp", "cp", "dp", "pp", "dpcp", "world" }) do
    mesh[name] = new_group(C.tt_mesh_group(box[0], name), mesh)
  end
  for _, dim in ipairs(DIMS) do mesh.coords[dim] = C.tt_mesh_coord(box[0], dim) end
  current = mesh
  return mesh
end

return dist
