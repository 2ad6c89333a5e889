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
-- forward_backward returns the sum of the micro-batch losses: a one-value tensor on the
-- device that nothing waits for (the training step reads it with its other scalars,
-- once; pipelined, the last stage broadcasts it to the others).
-- After forward_backward, strategy:forward_seconds() gives the seconds its forwards
-- computed (time blocked on communication left out: that is exposed communication; on
-- CUDA known once the device has got that far, see tetra.obs.timer); train.lua counts
-- the rest of forward_backward as backward.
local F = require("tetra.nn.functional")
local metrics = require("tetra.obs.metrics")
local trace = require("tetra.obs.trace")
local timers = require("tetra.obs.timer")
local micro = require("tetra.parallel.micro")
local pipeline = require("tetra.parallel.pipeline")

local free = F.free
local M = {}

local Plain = {}
Plain.__index = Plain

local Pipelined = {}
Pipelined.__index = Pipelined

-- par: tetra.parallel.apply's result; ddp: tetra.parallel.data's wrapper; ctx: the
-- tetra.amp context.
function M.new(par, ddp, ctx, cfg)
  local self = { par = par, ddp = ddp, ctx = ctx, model = par.model,
                  timer = timers.new(par.device) }
  -- A tied parameter's gradient must be summed over the stages before the reducer
  -- averages it: the reducer then copies every gradient at finish instead of during
  -- backward.
  self.overlap = par.tied_group == nil
  if par.stage then
    self.pipe = pipeline.runner(par, cfg)
    self.pipe.timer = self.timer   -- train.lua resets it each step
    return setmetatable(self, Pipelined)
  end
  return setmetatable(self, Plain)
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
  local sum = nil
  local timer = self.timer
  self.forward_marks = {}
  for m = 0, n_micro - 1 do
    local mb = micro.rows(tokens, m, rows)
    local f0, w0 = timer:mark(), metrics.now()
    local loss = loss_of(self, mb)
    local marks = self.forward_marks
    marks[#marks + 1] = f0
    marks[#marks + 1] = timer:mark()
    if trace.on then trace.span("forward", w0, metrics.now(), { micro = m }) end
    if mb ~= tokens then free(mb) end
    sum = micro.add_loss(sum, loss)
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

-- The seconds the last forward_backward's forwards computed.
function Plain:forward_seconds() return self.timer:total(self.forward_marks or {}) end

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
  end, self.ctx)
  finish(self)
  return sum
end

function Pipelined:forward_seconds() return self.pipe:forward_seconds() end

function Pipelined:eval_loss(tokens)
  return self.pipe:forward_loss(tokens)
end

return M
