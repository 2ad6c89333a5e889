-- tetra.obs.straggler: which rank holds the others up.
--
--   local s = straggler.new(cfg, mesh)   -- nil on one rank, or with monitoring off
--   s:observe(r)                         -- every rank, after each step (a collective)
--
-- A rank's compute time is its step time less the time it waited in collectives
-- (step_time_s - exposed_comm_s): in a synchronous job the ranks' step times are alike,
-- since the fast ones wait for the slow one, but their compute times are not. Each rank's
-- compute and wait seconds travel in one all-gather of two floats over the world. Rank
-- 0 adds to the step's record rank_compute_s and rank_wait_s (by world rank),
-- straggler_rank, straggler_compute_s and straggler_ratio (slowest / median), serves
-- the summary on its Prometheus endpoint, and prints one warning line when a rank's
-- compute time stays above log.straggler_factor x the median for log.straggler_steps
-- steps in a row. The gather runs when anything reads it: a metrics file, an endpoint
-- or the warning (log.straggler_factor > 0).
local dist = require("tetra.dist")
local metrics = require("tetra.obs.metrics")
local telemetry = require("tetra.obs.telemetry")

local M = {}

local Tracker = {}
Tracker.__index = Tracker

function M.new(cfg, mesh)
  local log = cfg.log or {}
  local factor = log.straggler_factor or 1.5
  if (mesh.size or 1) < 2 then return nil end
  if factor <= 0 and not log.metrics_file and log.prometheus_port == nil then return nil end
  return setmetatable({ world = mesh.world, is_main = mesh.rank == 0, factor = factor,
                        steps = log.straggler_steps or 3, streak = {} }, Tracker)
end

-- The summary of one step from every rank's { compute_s, wait_s } (index: world rank + 1):
-- the slowest rank (world rank), its compute seconds and its ratio to the median (nil
-- when the median is not positive).
function M.summarize(rows)
  local compute, slowest = {}, 1
  for i, row in ipairs(rows) do
    compute[i] = row[1]
    if row[1] > rows[slowest][1] then slowest = i end
  end
  local median = metrics.median(compute)
  return { rank = slowest - 1, compute_s = compute[slowest], median_s = median,
           ratio = median > 0 and compute[slowest] / median or nil, compute = compute }
end

-- A rank counts as slow only when it also lags the median by MIN_GAP_S or more: a step
-- of a few milliseconds (a small test model on a busy machine) is doubled by one
-- preemption of a core, which says nothing about the rank's host; the hosts a straggler
-- report is for cost a real job tenths of a second a step or more.
local MIN_GAP_S = 0.05
M.MIN_GAP_S = MIN_GAP_S

-- Ranks (world ranks) whose compute time has been above factor x the median (and MIN_GAP_S
-- past it) for exactly `steps` steps in a row now: each streak is reported once, when it
-- reaches `steps`.
function Tracker:judge(summary)
  local due = {}
  for i, c in ipairs(summary.compute) do
    local over = summary.median_s > 0 and c > self.factor * summary.median_s and
                 c - summary.median_s >= MIN_GAP_S
    self.streak[i] = over and (self.streak[i] or 0) + 1 or 0
    if self.streak[i] == self.steps then due[#due + 1] = i - 1 end
  end
  return due
end

function Tracker:observe(r)
  local compute = r.step_time_s - (r.exposed_comm_s or 0)
  local rows = self.world:gather_numbers({ compute, r.exposed_comm_s or 0 })
  if not self.is_main then return end
  local s = M.summarize(rows)
  local waits = {}
  for i, row in ipairs(rows) do waits[i] = row[2] end
  r.rank_compute_s, r.rank_wait_s = s.compute, waits
  r.straggler_rank, r.straggler_compute_s, r.straggler_ratio = s.rank, s.compute_s, s.ratio
  telemetry.straggler(s.rank, s.compute_s, s.ratio)
  if self.factor <= 0 then return end
  for _, rank in ipairs(self:judge(s)) do
    io.stderr:write(string.format("warning: straggler: rank %d (host %s) computed %.3f s " ..
      "a step, %.2fx the median %.3f s, for %d steps in a row (step %d; " ..
      "log.straggler_factor=%g)\n", rank, dist.rank_host(rank), s.compute[rank + 1],
      s.compute[rank + 1] / s.median_s, s.median_s, self.steps, r.step, self.factor))
    io.stderr:flush()
  end
end

return M
