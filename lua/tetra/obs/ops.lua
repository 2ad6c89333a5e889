-- tetra.obs.ops: where a forward and backward spend their time, op by op, from the
-- engine's op profile (tt_op_profile_*, engine/core/op_profile.c).
--
--   local ops = require("tetra.obs.ops")
--   local prof = ops.profile(device, function() ... forward and backward ... end)
--   print(ops.format(prof, 20))
--
-- Every interval between two marks of the tape is charged to the mark that ends it: an
-- op recorded in forward (its work and any untaped work since the mark before), a node's
-- backward, a checkpoint's re-run ("recompute"), or outside ops (before each backward
-- node, and up to the end); the entries add up to the whole. On CUDA the marks are events
-- in stream order and the profile waits for the device once at its end: the kernels'
-- time, not the launches'. The REPL's profile_step() prints a step's; `tetra profile
-- --ops` a recipe's model's; log.op_profile_step a training step's (tetra.train).
local ffi = require("ffi")
local tffi = require("tetra.ffi")

local C = ffi.C
local M = {}

M.PHASES = { [0] = "fwd", [1] = "bwd", [2] = "recompute", [3] = "outside", [4] = "region" }

-- Starts the op profile for ops on `device` (the engine's device number: 0.. for GPUs,
-- C.TT_CPU) on this thread.
function M.start(device)
  tffi.check(C.tt_op_profile_start(device))
end

-- Whether a profile runs on this thread.
function M.running()
  return C.tt_op_profile_running() ~= 0
end

-- Charges the time since the last mark to the region `name` (work that records no op:
-- the optimizer's update, say); nothing when no profile runs.
function M.region(name)
  tffi.check(C.tt_op_profile_region(name))
end

-- Ends the profile: { total_s, entries = { { name, phase, calls, seconds } ... } },
-- longest first. Raises when marks were lost.
function M.stop()
  local total = ffi.new("double[1]")
  local n = C.tt_op_profile_stop(total)
  if n < 0 then error(ffi.string(C.tt_last_error()), 0) end
  local buf = ffi.new("tt_op_profile_entry[?]", math.max(n, 1))
  n = C.tt_op_profile_take(buf, n)
  local entries = {}
  for i = 0, n - 1 do
    local e = buf[i]
    entries[i + 1] = { name = ffi.string(e.name), phase = M.PHASES[e.phase],
                       calls = tonumber(e.calls), seconds = e.seconds }
  end
  return { total_s = total[0], entries = entries }
end

-- Runs fn() under the op profile (M.start, M.stop) and returns the profile. An error in
-- fn ends the profile and is raised again.
function M.profile(device, fn)
  M.start(device)
  local ok, err = pcall(fn)
  local sok, prof = pcall(M.stop)
  if not ok then error(err, 0) end
  if not sok then error(prof, 0) end
  return prof
end

-- The table of prof's `top` longest entries (all when nil), one line each, the rest
-- summed on a line of their own, then the total: a string of lines.
function M.format(prof, top)
  local lines = { string.format("%-32s %-9s %7s %10s %7s", "op", "phase", "calls", "ms",
                                "share") }
  local total = prof.total_s > 0 and prof.total_s or 1
  local shown = top and math.min(top, #prof.entries) or #prof.entries
  for i = 1, shown do
    local e = prof.entries[i]
    lines[#lines + 1] = string.format("%-32s %-9s %7d %10.3f %6.1f%%", e.name, e.phase,
                                      e.calls, e.seconds * 1e3, 100 * e.seconds / total)
  end
  if shown < #prof.entries then
    local rest, calls = 0, 0
    for i = shown + 1, #prof.entries do
      rest, calls = rest + prof.entries[i].seconds, calls + prof.entries[i].calls
    end
    lines[#lines + 1] = string.format("%-32s %-9s %7d %10.3f %6.1f%%",
      string.format("(%d more)", #prof.entries - shown), "", calls, rest * 1e3,
      100 * rest / total)
  end
  lines[#lines + 1] = string.format("%-32s %-9s %7s %10.3f %6.1f%%", "all", "", "",
                                    prof.total_s * 1e3, 100)
  return table.concat(lines, "\n")
end

return M
