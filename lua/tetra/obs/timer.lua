-- tetra.obs.timer: compute time without waiting for the device, for the step's breakdown
-- (forward, backward; communication left out).
--
--   local t = timer.new(device)   -- t:mark() -> a mark; t:seconds(a, b) -> the compute
--                                 -- seconds between two marks; t:total(marks) -> the
--                                 -- seconds of pairs of marks; t:reset() before each step
--   timer.null()                  -- marks nothing, measures 0
--
-- On the cpu a mark is the wall clock minus the time blocked in collectives (the seconds
-- are known at once). On CUDA it is an event recorded on the current stream, so the host
-- never waits for it; the seconds between two marks are known once the device has passed
-- the second, which the step's one read of its stats guarantees. The events are pooled
-- and reused after reset().
local ffi = require("ffi")
local tffi = require("tetra.ffi")
tffi.cdef_header("tetra_dist.h")   -- tt_dist_wait_seconds
local metrics = require("tetra.obs.metrics")

local C = tffi.C
local M = {}

local CpuTimer = {}
CpuTimer.__index = CpuTimer
function CpuTimer:mark() return metrics.now() - C.tt_dist_wait_seconds() end
function CpuTimer:seconds(a, b) return b - a end
function CpuTimer:reset() end
function CpuTimer:wait() end

local CudaTimer = {}
CudaTimer.__index = CudaTimer

function CudaTimer:mark()
  self.used = self.used + 1
  local e = self.pool[self.used]
  if not e then
    local box = ffi.new("tt_cuda_event *[1]")
    tffi.check(C.tt_cuda_event_create(1, box))
    e = ffi.gc(box[0], C.tt_cuda_event_destroy)
    self.pool[self.used] = e
  end
  tffi.check(C.tt_cuda_event_record(e, C.tt_cuda_get_stream()))
  return e
end

function CudaTimer:seconds(a, b)
  tffi.check(C.tt_cuda_event_elapsed_ms(a, b, self.ms))
  return self.ms[0] / 1000
end

function CudaTimer:reset() self.used = 0 end

-- Waits until the device has passed mark m, unless it already has (no wait then).
function CudaTimer:wait(m)
  if C.tt_cuda_event_query(m) ~= 1 then tffi.check(C.tt_cuda_event_synchronize(m)) end
end

-- The seconds between each pair of marks: marks[1]..marks[2] + marks[3]..marks[4] + ...
local function total(self, marks)
  local t = 0
  for i = 1, #marks, 2 do t = t + self:seconds(marks[i], marks[i + 1]) end
  return t
end
CpuTimer.total, CudaTimer.total = total, total

-- Marks nothing and measures 0: inside a captured CUDA graph, which is timed as a whole.
local NullTimer = { mark = function() return 0 end, seconds = function() return 0 end,
                    reset = function() end, wait = function() end, total = function() return 0 end }
function M.null() return NullTimer end

-- The timer of engine device `device` (nil or C.TT_CPU: the cpu).
function M.new(device)
  if device == nil or device == C.TT_CPU then return setmetatable({}, CpuTimer) end
  tffi.cdef_header("tetra_cuda.h")
  return setmetatable({ pool = {}, used = 0, ms = ffi.new("float[1]") }, CudaTimer)
end

return M
