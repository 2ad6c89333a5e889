-- tetra.train.device: train.device, the parameters moved there, and each batch uploaded
-- through pinned staging buffers.
local ffi = require("ffi")
local tffi = require("tetra.ffi")
local C = tffi.C
local F = require("tetra.nn.functional")
local T = require("tetra.tensor")

local device = {}

local free = F.free

-- The engine device id for train.device (C.TT_CPU for "cpu"), the device started
-- (tetra.device, which tetra.dist also starts it through).
device.id = require("tetra.device").start

-- Moves every parameter of model to device `dev` (an engine device id) as a new leaf
-- that requires grad, replacing it in its module. A tensor shared by two modules (tied
-- embeddings) becomes one shared copy. Call before building the optimizer. always: new
-- tensors on the device it is on as well (the tests' TETRA_TEST_MOVE_MODEL=1: on the CPU,
-- what a move to a GPU does to whatever kept a parameter from before it).
function device.move_model(model, dev, always)
  local moved = {}
  for _, nm in ipairs(model:named_modules()) do
    local m = nm[2]
    for _, name in ipairs(m._param_names) do
      local p = m[name]
      if p ~= nil and (p._device ~= dev or always) then
        local key = tostring(ffi.cast("uintptr_t", ffi.cast("void *", p)))
        if not moved[key] then
          local d = p._device ~= dev and T.take(C.tt_to_device(p, dev, T.pout))
                    or T.no_grad(function() return T.take(C.tt_clone(p, T.pout)) end)
          tffi.check(C.tt_set_requires_grad(d, 1))
          moved[key] = d
        end
        m[name] = moved[key]
      end
    end
  end
end

local function upload_check(host, into)
  if into._dtype ~= host._dtype or into:numel() ~= host:numel() then
    error("train: a batch of another shape or dtype than the captured step's input", 3)
  end
end

-- upload(host[, into]) for device `dev`: batches there without a wait for the GPU (a
-- plain copy from pageable memory waits for it), through two page-locked staging buffers
-- used in turns. An event recorded after each buffer's copy says when the buffer may be
-- written again: normally long done (the step's one read of its stats came after it),
-- and waited for only when not (a caller that uploads twice before the device gets
-- there). On the CPU: the batch. With `into` (a device tensor of the batch's shape and
-- dtype: the static input of a captured step) the batch is copied there, also on the CPU.
-- cu: the CUDA runtime's entries (tetra_cuda.h; default the engine's), for a test's
-- stand-in whose copies land late; with it, dev may be the CPU.
function device.uploader(dev, cu)
  if dev == C.TT_CPU and not cu then
    return function(t, into)
      if not into then return t end
      upload_check(t, into)
      tffi.check(C.tt_copy_(into, t))
      free(t)
      return into
    end
  end
  tffi.cdef_header("tetra_cuda.h")
  cu = cu or C
  local bufs, sizes, turn, done = {}, { 0, 0 }, 0, {}
  local box = ffi.new("void *[1]")
  local ebox = ffi.new("tt_cuda_event *[1]")
  return function(host, into)
    if into then upload_check(host, into) end
    local c = host
    if not host:is_contiguous() then c = host:contiguous() end
    local n = tonumber(C.tt_tensor_numel(c)) * tonumber(C.tt_dtype_size(c._dtype))
    turn = turn % 2 + 1
    if not done[turn] then
      tffi.check(cu.tt_cuda_event_create(0, ebox))
      done[turn] = ffi.gc(ebox[0], cu.tt_cuda_event_destroy)
    else
      local q = cu.tt_cuda_event_query(done[turn])
      if q < 0 then tffi.check(-1) end
      if q == 0 then tffi.check(cu.tt_cuda_event_synchronize(done[turn])) end
    end
    if sizes[turn] < n then
      if bufs[turn] then cu.tt_cuda_host_free(bufs[turn]) end
      tffi.check(cu.tt_cuda_host_alloc(n, box))
      bufs[turn], sizes[turn] = box[0], n
    end
    ffi.copy(bufs[turn], C.tt_tensor_data(c), n)
    local out = into or F.empty(host:shape(), c._dtype, dev)
    if n > 0 then
      tffi.check(cu.tt_cuda_copy_to_device_async(C.tt_tensor_data(out), dev, bufs[turn], n))
    end
    tffi.check(cu.tt_cuda_event_record(done[turn], cu.tt_cuda_get_stream()))
    if c ~= host then free(c) end
    free(host)
    return out
  end
end

-- A capture needs a stream of its own (the legacy default stream cannot be captured):
-- the whole run goes on it, so the warm-up steps grow the allocator's cache and make the
-- GEMM workspaces there. It lives as long as the process.
function device.use_own_stream()
  local box = ffi.new("tt_cuda_stream *[1]")
  tffi.check(C.tt_cuda_stream_create(box))
  tffi.check(C.tt_cuda_set_stream(box[0]))
end

return device
