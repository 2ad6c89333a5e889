-- tetra.planner.schedule: the engine's pipeline schedule replayed with predicted times.
local pipeline = require("tetra.parallel.pipeline")

local M = {}

-- The engine's op lists depend only on (schedule, stages, stage, micro-batches, chunks),
-- and the planner replays the same few for thousands of layouts: built once each (the
-- replay only reads them).
local built, n_built = {}, 0
local function ops_of(kind, S, s, n_micro, v)
  local key = table.concat({ kind, S, s, n_micro, v }, ",")
  local ops = built[key]
  if not ops then
    if n_built >= 4096 then built, n_built = {}, 0 end
    ops = pipeline.schedule(kind, S, s, n_micro, v)
    built[key], n_built = ops, n_built + 1
  end
  return ops
end

-- Replays the whole schedule of n_micro micro-batches (M.replay's results; also
-- M.replay_whole, which tests compare the extended replay with).
local function replay_all(lay, n_micro, fwd, bwd, hop)
  local S, v = lay.pp, lay.v
  local kind = S == 1 and "1f1b" or lay.schedule   -- one stage: F, B, F, B ...
  local ops, pos, clock, busy, held, peak = {}, {}, {}, {}, {}, {}
  for s = 0, S - 1 do
    ops[s] = ops_of(kind, S, s, n_micro, v)
    pos[s], clock[s], busy[s], held[s], peak[s] = 1, 0, 0, {}, {}
    for c = 0, v - 1 do held[s][c], peak[s][c] = 0, 0 end
  end
  local done = {}   -- (direction, virtual stage, micro-batch) -> finish time
  local function key(kind_, vs, m) return ((kind_ == "F" and 0 or 1) * S * v + vs) * n_micro + m end
  local last_vs = S * v - 1
  local left = 0
  for s = 0, S - 1 do left = left + #ops[s] end
  while left > 0 do
    local progressed = false
    for s = 0, S - 1 do
      local op = ops[s][pos[s]]
      while op do
        local kind_, m, c = op[1], op[2], op[3] or 0
        local vs = c * S + s
        local dep
        if kind_ == "F" then
          dep = vs == 0 and 0 or done[key("F", vs - 1, m)]
          if dep and vs > 0 then dep = dep + hop end
        else
          dep = vs == last_vs and done[key("F", vs, m)] or done[key("B", vs + 1, m)]
          if dep and vs < last_vs then dep = dep + hop end
        end
        if not dep then break end
        local dur = kind_ == "F" and fwd[s][c] or bwd[s][c]
        local start = math.max(clock[s], dep)
        clock[s] = start + dur
        busy[s] = busy[s] + dur
        done[key(kind_, vs, m)] = clock[s]
        if kind_ == "F" then
          held[s][c] = held[s][c] + 1
          if held[s][c] > peak[s][c] then peak[s][c] = held[s][c] end
        else
          held[s][c] = held[s][c] - 1
        end
        pos[s], left, progressed = pos[s] + 1, left - 1, true
        op = ops[s][pos[s]]
      end
    end
    if not progressed then error("pipeline replay: the schedule deadlocks", 0) end
  end
  local span = 0
  for s = 0, S - 1 do span = math.max(span, clock[s]) end
  return span, busy, peak
end

-- Replays the engine's schedule (tetra.parallel.pipeline.schedule) for every stage with
-- per-chunk forward and backward times fwd[s][c], bwd[s][c] and a transfer time `hop`
-- between stages. Returns the makespan, each stage's busy time and the most
-- micro-batches each stage holds at once per chunk ({ [s] = { [c] = n } }).
--
-- A long step is not replayed op by op (a batch of 1e9 rows would take hours): past its
-- warm-up a schedule repeats, each micro-batch adding the same time and the same number
-- held (none for 1F1B, one for GPipe), so two replays in that steady state, n1 and n2
-- micro-batches, extend linearly to n_micro. Both are multiples of the stage count (the
-- interleaved schedule's rule) and at least four warm-ups long. Where the work outlasts
-- the transfers the extension is the whole replay to rounding; where transfers outlast
-- the work the steady state repeats over a few micro-batches, and the span is within
-- about one micro-batch's time of it (tests/lua/plan_spec.lua measures both).
function M.replay(lay, n_micro, fwd, bwd, hop)
  local S, v = lay.pp, lay.v
  local n1 = S * math.ceil(math.max(256, 4 * S * v) / S)
  local n2 = n1 + S * math.ceil(math.max(128, 2 * S * v) / S)
  if n_micro <= n2 then return replay_all(lay, n_micro, fwd, bwd, hop) end
  local span1, busy1, peak1 = replay_all(lay, n1, fwd, bwd, hop)
  local span2, busy2, peak2 = replay_all(lay, n2, fwd, bwd, hop)
  local k = (n_micro - n2) / (n2 - n1)
  local busy, peak = {}, {}
  for s = 0, S - 1 do
    busy[s], peak[s] = busy2[s] + k * (busy2[s] - busy1[s]), {}
    for c = 0, v - 1 do peak[s][c] = peak2[s][c] + k * (peak2[s][c] - peak1[s][c]) end
  end
  return span2 + k * (span2 - span1), busy, peak
end
M.replay_whole = replay_all

return M
