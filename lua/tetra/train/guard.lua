-- tetra.train.guard: the loss guard of the training loop (train.loss_guard).
--
-- A step is bad when its loss (the mean over the ranks) is NaN or Inf, when its
-- gradients are (their global norm is not finite; fp16's routine overflows are the loss
-- scaler's business and do not count), or, with train.spike_zscore > 0, when the loss
-- lies more than spike_zscore standard deviations above the mean of the last
-- spike_window good steps. The verdict is all-reduced (max of a flag over every rank), so
-- every rank skips the same steps. A bad step's optimizer update is skipped; after
-- train.max_bad_steps bad steps in a row tetra.train rolls back to the latest
-- checkpoint and skips the data of the bad steps: from then on step s reads the global
-- batch at data position s + (the batches skipped at or before s).
--
-- The spike window and the skipped windows are part of the checkpoint (state.json's
-- `guard`), so a resumed run judges and reads exactly like an uninterrupted one.
local M = {}

local Guard = {}
Guard.__index = Guard

function M.new(cfg)
  local t = cfg.train
  return setmetatable({
    enabled = t.loss_guard ~= false,
    zscore = t.spike_zscore or 0,
    window_size = t.spike_window or 50,
    max_bad = t.max_bad_steps or 3,
    inject_from = t.inject_nan_step or 0,
    inject_count = t.inject_nan_count or 1,
    window = {},   -- losses of the last window_size good steps, oldest first
    skips = {},    -- { step =, count = }: from `step` on, `count` more batches are skipped
    bad = {},      -- the current run of bad steps: { step =, position = }
  }, Guard)
end

-- The loss above which the next step is a spike: mean + spike_zscore x std of the
-- window (math.huge when there is no spike check yet: no zscore, a window not full, or
-- no spread). tetra.train puts it in the optimizer's stats, where the device compares the
-- step's loss with it and skips the update of a spike without a read first.
-- The window's mean and standard deviation, once the spike check has a full window to
-- judge by (nil otherwise).
local function window_stats(self)
  local n = #self.window
  if not (self.enabled and self.zscore > 0 and n >= self.window_size) then return nil end
  local mean, var = 0.0, 0.0
  for _, x in ipairs(self.window) do mean = mean + x end
  mean = mean / n
  for _, x in ipairs(self.window) do var = var + (x - mean) ^ 2 end
  return mean, math.sqrt(var / n)
end

function Guard:loss_limit()
  local mean, std = window_stats(self)
  if not (mean and std > 0) then return math.huge end
  return mean + self.zscore * std
end

-- The data position (1-based global batch index) step `step` reads.
function Guard:position(step)
  local pos = step
  for _, w in ipairs(self.skips) do
    if step >= w.step then pos = pos + w.count end
  end
  return pos
end

-- Whether the test switch train.inject_nan_step poisons the batch at `pos`.
function Guard:poisoned(pos)
  return self.inject_from > 0 and pos >= self.inject_from and
         pos < self.inject_from + self.inject_count
end

local function finite(x) return x == x and x ~= math.huge and x ~= -math.huge end

-- Why `loss` makes a step bad ("nonfinite_loss", "spike"), or nil. spike (optional):
-- the device's verdict against loss_limit(), which then replaces the comparison here (the
-- two agree but for rounding at the limit, and the device already acted on its own).
function Guard:judge_loss(loss, spike)
  if not self.enabled then return nil end
  if not finite(loss) then return "nonfinite_loss" end
  if spike ~= nil then return spike and "spike" or nil end
  local mean, std = window_stats(self)
  if mean and std > 0 and (loss - mean) / std > self.zscore then return "spike" end
  return nil
end

-- Ends a step: reason nil (a good step; `loss` joins the window) or why it was bad.
-- Returns true when the run of bad steps reached train.max_bad_steps.
function Guard:finish(step, pos, loss, reason)
  if not reason then
    self.bad = {}
    local w = self.window
    w[#w + 1] = loss
    if #w > self.window_size then table.remove(w, 1) end
    return false
  end
  self.bad[#self.bad + 1] = { step = step, position = pos }
  return #self.bad >= self.max_bad
end

-- The run of bad steps: its first and last { step =, position = }.
function Guard:bad_run()
  return self.bad[1], self.bad[#self.bad]
end

-- After a roll back to a checkpoint of step `resumed` (its guard state loaded): the data
-- up to `last` (the bad run's last { step =, position = }) is skipped, from the first
-- step the run will repeat on. Returns that step and the first data position skipped.
function Guard:skip_to_after(resumed, first, last)
  local from = math.max(first.step, resumed + 1)
  local pos = self:position(from)
  self.skips[#self.skips + 1] = { step = from, count = last.position - pos + 1 }
  self.bad = {}
  return from, pos
end

-- For state.json; the window's losses are doubles and round-trip through %.17g.
function Guard:state()
  return { window = self.window, skips = self.skips }
end

function Guard:load_state(s)
  self.window, self.skips, self.bad = {}, {}, {}
  if type(s) ~= "table" then return end
  for i, x in ipairs(s.window or {}) do self.window[i] = x end
  for i, w in ipairs(s.skips or {}) do self.skips[i] = { step = w.step, count = w.count } end
end

return M
