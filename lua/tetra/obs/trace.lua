-- tetra.obs.trace: a Chrome/Perfetto timeline of chosen steps, one JSON file per rank.
--
--   log.trace_steps = "10:12"   -- steps 10 to 12 (or "10": that step alone)
--   log.trace_dir = "trace"     -- trace/trace-rank<R>.json
--   tetra trace merge all.json trace/trace-rank*.json   -- one timeline, a process per rank
--
-- Open the files in https://ui.perfetto.dev or chrome://tracing (Trace Event Format,
-- "X" complete events). Thread "compute" holds the step's regions (data wait, each
-- micro-batch's forward and backward, the pipeline's F and B of each micro-batch and
-- chunk, optimizer, checkpoint); thread "communication" each collective from its start
-- to its completion on this rank (engine/dist times them), send and recv included, so
-- pipeline bubbles and the overlap of communication with compute can be seen.
--
-- Times are microseconds on rank 0's clock, from when tracing was set up: ranks on one
-- machine share its monotonic clock; across machines each rank measures its clock
-- against rank 0's after barriers (good to the barriers' skew).
local ffi = require("ffi")
local tffi = require("tetra.ffi")
tffi.cdef_header("tetra_telemetry.h")
local C = ffi.C
local metrics = require("tetra.obs.metrics")

local M = { on = false }

local COMPUTE, COMM = 0, 1

-- "A:B" or "A" -> first, last; nil and a message when malformed.
function M.parse_steps(spec)
  local a, b = tostring(spec):match("^%s*(%d+)%s*:%s*(%d+)%s*$")
  if not a then
    a = tostring(spec):match("^%s*(%d+)%s*$")
    b = a
  end
  a, b = tonumber(a), tonumber(b)
  if not a or a < 1 or b < a then
    return nil, string.format("log.trace_steps = %q: want FIRST:LAST steps (1 <= FIRST <= " ..
                              "LAST), e.g. 10:12, or one step", tostring(spec))
  end
  return a, b
end

local state

-- Prepares tracing for cfg.log.trace_steps (nothing when unset). Collective over the
-- world (the clock alignment): every rank calls it.
function M.setup(cfg, mesh)
  local log = cfg.log or {}
  M.on, state = false, nil
  if not log.trace_steps then return end
  local first, last = M.parse_steps(log.trace_steps)
  local dir = log.trace_dir or "trace"
  -- The folder and this rank's file are made now, so that an unwritable log.trace_dir
  -- stops the run at its start, not after the traced steps.
  local fs = require("tetra.util.fs")
  fs.mkdir_p(dir, "log.trace_dir")
  local path = string.format("%s/trace-rank%d.json", dir, mesh.rank)
  fs.write_file(path, "", "log.trace_dir")
  -- offset: rank 0's clock minus ours; base: rank 0's clock now (timestamps count from
  -- it, so they stay small enough for full precision).
  -- Ranks on one machine share its monotonic clock (CLOCK_MONOTONIC is system-wide):
  -- their offset is 0, exactly. Across machines, the median of 5 barrier measurements
  -- (a rank descheduled as it leaves one barrier spoils that one only).
  local offset, base = 0, metrics.now()
  if (mesh.size or 1) > 1 then
    local tensor = require("tetra.tensor")
    local F = require("tetra.nn.functional")
    local one_node = C.tt_dist_local_size() == mesh.size
    local t = tensor.from_table({ 0 }, { dtype = "i64" })
    local offsets = {}
    for i = 1, one_node and 1 or 5 do
      mesh.world:barrier()
      local mine = metrics.now()
      C.tt_tensor_set(t, 0, math.floor(mine * 1e9))
      mesh.world:broadcast(t, 0)
      base = tonumber(C.tt_tensor_get(t, 0)) * 1e-9
      offsets[i] = one_node and 0 or base - mine
    end
    table.sort(offsets)
    offset = offsets[math.floor((#offsets + 1) / 2)]   -- base: rank 0's clock, the same everywhere
    F.free(t)
  end
  state = { first = first, last = last, path = path, rank = mesh.rank, offset = offset - base,
            coords = mesh.coords, events = {} }
end

local function us(self, t) return (t + self.offset) * 1e6 end

-- Called as step `step` starts and ends; returns true while it is traced.
function M.begin_step(step)
  if not state or step < state.first or step > state.last then return false end
  M.on = true
  C.tt_trace_set_enabled(1)
  return true
end

-- One region of the compute thread from t0 to t1 (tetra.metrics.now seconds).
function M.span(name, t0, t1, args)
  if not M.on then return end
  state.events[#state.events + 1] = { name = name, cat = "compute", ph = "X", pid = state.rank,
    tid = COMPUTE, ts = us(state, t0), dur = (t1 - t0) * 1e6, args = args }
end

local take_buf = ffi.new("tt_trace_event[256]")

local function take_collectives()
  while true do
    local n = C.tt_trace_take(take_buf, 256)
    for i = 0, n - 1 do
      local e = take_buf[i]
      state.events[#state.events + 1] = { name = ffi.string(e.op), cat = "communication",
        ph = "X", pid = state.rank, tid = COMM, ts = us(state, e.start_s),
        dur = (e.end_s - e.start_s) * 1e6, args = { group = ffi.string(e.group) } }
    end
    if n < 256 then return end
  end
end

local function write()
  local c = state.coords or {}
  local meta = {
    { name = "process_name", ph = "M", pid = state.rank, tid = COMPUTE,
      args = { name = string.format("rank %d (dp %d tp %d pp %d cp %d)", state.rank,
                                    c.dp or 0, c.tp or 0, c.pp or 0, c.cp or 0) } },
    { name = "process_sort_index", ph = "M", pid = state.rank, tid = COMPUTE,
      args = { sort_index = state.rank } },
    { name = "thread_name", ph = "M", pid = state.rank, tid = COMPUTE,
      args = { name = "compute" } },
    { name = "thread_name", ph = "M", pid = state.rank, tid = COMM,
      args = { name = "communication" } },
  }
  local f, err = io.open(state.path, "w")
  if not f then
    require("tetra.util.errors").raise("log.trace_dir: cannot write %s: %s", state.path, tostring(err))
  end
  -- One event per line: `tetra trace merge` reads the files back line by line.
  f:write('{"displayTimeUnit":"ms","traceEvents":[\n')
  local all = {}
  for _, e in ipairs(meta) do all[#all + 1] = e end
  for _, e in ipairs(state.events) do all[#all + 1] = e end
  for i, e in ipairs(all) do
    f:write(metrics.encode(e), i < #all and ",\n" or "\n")
  end
  f:write("]}\n")
  f:close()
end

-- After step `step` (its record written): collects its collectives; after the last
-- traced step (or the run's last, total), writes this rank's file.
function M.end_step(step, total)
  if not M.on then return end
  take_collectives()
  if step >= state.last or step >= total then
    M.on = false
    C.tt_trace_set_enabled(0)
    write()
    state.written = state.path
  end
end

-- The file this rank wrote (nil before).
function M.written() return state and state.written end

return M
