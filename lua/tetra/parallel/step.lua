-- tetra.parallel.step: how one optimizer step's forward and backward run for a layout.
--
--   local strategy = step.new(par, ddp, amp_ctx, cfg)
--   local loss_sum = strategy:forward_backward(tokens, n_micro)  -- grads complete after
--   local loss = strategy:eval_loss(tokens)                      -- no tape
--
-- plain      (no pipeline parallelism) each of the n_micro micro-batches of this rank's
--            rows: its part of the sequences (context parallelism), forward, loss /
--            n_micro (x the fp16 loss scale), backward; data parallelism's reducer armed
--            for the last one, so the last backward overlaps the gradient averaging.
-- pipelined  the micro-batches through the stages on the pipeline schedule
--            (tetra.parallel.pipeline).
-- Both then sum the gradients of tied copies on the first and last stage and finish the
-- data-parallel averaging: the gradients are the single process's gradients of the
-- global batch. Tensor and sequence parallelism need nothing here: their collectives are
-- differentiable ops inside forward and backward.
--
-- After forward_backward, strategy.forward_s holds the seconds its forwards computed
-- (time blocked on communication left out: that is exposed communication); train.lua
-- counts the rest of forward_backward as backward.
local F = require("tetra.nn.functional")
local tffi = require("tetra.ffi")
local C = tffi.C
local metrics = require("tetra.metrics")
local trace = require("tetra.trace")

local free = F.free
local M = {}

local Plain = {}
Plain.__index = Plain

local Pipelined = {}
Pipelined.__index = Pipelined

-- par: tetra.parallel.apply's result; ddp: tetra.parallel.data's wrapper; ctx: the
-- tetra.amp context.
function M.new(par, ddp, ctx, cfg)
  local self = { par = par, ddp = ddp, ctx = ctx, model = par.model, forward_s = 0 }
  -- A tied parameter's gradient must be summed over the stages before the reducer
  -- averages it: the reducer then copies every gradient at finish instead of during
  -- backward.
  self.overlap = par.tied_group == nil
  if par.stage then
    self.pipe = require("tetra.parallel.pipeline").runner(par, cfg)
    return setmetatable(self, Pipelined)
  end
  return setmetatable(self, Plain)
end

local function micro_rows(tokens, m, n)
  if m == 0 and n == tonumber(tokens._shape[0]) then return tokens end
  local v = F.narrow(tokens, 0, m * n, n)
  local c = F.contiguous(v)
  free(v)
  return c
end

-- A clock for the compute time of a region: wall time minus the time blocked in
-- collectives. On a GPU the region's kernels are waited for first, so the time is theirs
-- and not only their launches'.
function M.compute_clock(device)
  local sync = device ~= nil and device ~= C.TT_CPU
  return function()
    if sync then tffi.check(C.tt_cuda_synchronize()) end
    return metrics.now() - C.tt_dist_wait_seconds()
  end
end

local function finish(self)
  self.par:sync_tied_grads()
  self.ddp:finish_grads()
end

-- Mean loss of tokens (b, T + 1) on this rank's part, with the tape.
local function loss_of(self, tokens)
  local ids, targets, positions = self.par:inputs(tokens)
  local logits = self.model(ids, positions)
  free(ids); free(positions)
  local loss = self.par:loss(logits, targets)
  free(logits); free(targets)
  return loss
end

-- Forward and backward of tokens (this rank's rows) in n_micro micro-batches; the
-- parameters' grads then hold the gradient of the mean loss (x the loss scale). Returns
-- the sum of the micro-batch losses.
function Plain:forward_backward(tokens, n_micro)
  local rows = tonumber(tokens._shape[0]) / n_micro
  local sum = 0.0
  local clock = M.compute_clock(self.par.device)
  self.forward_s = 0
  for m = 0, n_micro - 1 do
    local mb = micro_rows(tokens, m, rows)
    local f0, w0 = clock(), metrics.now()
    local loss = loss_of(self, mb)
    self.forward_s = self.forward_s + clock() - f0
    if trace.on then trace.span("forward", w0, metrics.now(), { micro = m }) end
    if mb ~= tokens then free(mb) end
    sum = sum + F.item(loss)
    local mean = n_micro > 1 and F.scale(loss, 1.0 / n_micro) or loss
    local scaled = self.ctx:scale_loss(mean)             -- fp16: x loss scale
    self.ddp:before_backward(self.overlap and m == n_micro - 1)
    local b0 = metrics.now()
    F.backward(scaled)
    if trace.on then trace.span("backward", b0, metrics.now(), { micro = m }) end
    if scaled ~= mean then free(scaled) end
    if mean ~= loss then free(mean) end
    free(loss)
  end
  finish(self)
  return sum
end

function Plain:eval_loss(tokens)
  local loss = loss_of(self, tokens)
  local v = F.item(loss)
  free(loss)
  return v
end

function Pipelined:forward_backward(tokens, n_micro)
  local ddp, overlap = self.ddp, self.overlap
  local sum = self.pipe:train_step(tokens, n_micro, function(is_last)
    ddp:before_backward(overlap and is_last)
  end, self.ctx:scale())
  self.forward_s = self.pipe.forward_s
  finish(self)
  return sum
end

function Pipelined:eval_loss(tokens)
  return self.pipe:forward_loss(tokens)
end

return M
