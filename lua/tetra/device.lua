-- tetra.device: starting the device a process computes on (train.device). It sits below
-- tetra.dist, which starts this rank's GPU before it makes the NCCL communicators, and
-- below tetra.train, which starts it for the run (tetra.train.device is this start).
--
--   local dev = device.start("cuda")   -- the engine device id (C.TT_CPU for "cpu")
local ffi = require("ffi")
local tffi = require("tetra.ffi")
local errors = require("tetra.util.errors")

local C = tffi.C
local M = {}

-- The engine device id for train.device: C.TT_CPU for "cpu" (or nil); for "cuda" /
-- "cuda:N" starts the CUDA backend (tt_cuda_init picks this rank's GPU; "cuda:N" then
-- selects N). Raises "no CUDA device: ..." when the binary has no CUDA or finds no GPU.
function M.start(name)
  if name == nil or name == "cpu" then return C.TT_CPU end
  local n = name == "cuda" and -1 or tonumber(tostring(name):match("^cuda:(%d+)$"))
  if not n then
    errors.raise("train.device: unknown device '" .. tostring(name) .. "' (cpu, cuda or cuda:N)")
  end
  if not (pcall(tffi.cdef_header, "tetra_cuda.h") and tffi.has_symbol("tt_cuda_init")) then
    errors.raise("no CUDA device: this tetra was built without CUDA (train.device=" ..
               name .. "; rebuild with -DTETRA_CUDA=ON or use train.device=cpu)")
  end
  if C.tt_cuda_init() ~= 0 then errors.raise(ffi.string(C.tt_last_error())) end
  -- cuBLASLt is opened here, before anything is allocated, rather than at the first GEMM.
  if C.tt_blaslt_loaded() == 0 then errors.raise(ffi.string(C.tt_last_error())) end
  if n >= 0 and C.tt_cuda_set_device(n) ~= 0 then errors.raise(ffi.string(C.tt_last_error())) end
  return C.tt_cuda_current_device()
end

return M
