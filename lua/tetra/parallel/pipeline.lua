-- tetra.parallel.pipeline: pipeline parallelism over the mesh's pp group.
--
--   local pp = tetra.parallel.pipeline
--   pp.stage_layers(n_layers, stages, counts)   -- layers per stage (uniform, or counts)
--   pp.schedule(kind, stages, stage, n_micro)   -- this stage's ops: { "F"|"B", micro }
--   local pipe = pp.split(model, mesh.pp, cfg)  -- keeps this stage's part of model
--   pipe:train_step(tokens, n_micro, ddp)       -- forward + backward of every micro-batch
--                                               -- -> the summed micro-batch losses
--   pipe:forward_loss(tokens)                   -- no tape: the mean loss of one batch
--   pipe:clip_grad_norm(params, max_norm)       -- the global norm over every stage
--
-- Stage s of S holds a contiguous run of the model's blocks (uniformly: n_layers / S
-- each, the first n_layers % S stages one more; or parallel.pipeline_stages), the first
-- stage the embedding too, the last one the final norm, the head and the loss. The model
-- needs embed(ids) -> (B, T, dim), a ModuleList `layers` and head(h) -> logits (see
-- recipes/llama.lua). Every rank builds the whole model from the same seed, then drops
-- what other stages hold, so each stage's weights equal the single-process ones.
--
-- One optimizer step: every stage sees the same micro-batches. A forward (F) receives
-- the activations (B_micro, T, dim) from the previous stage (the first stage embeds the
-- tokens), runs its blocks and sends the result to the next stage (the last one computes
-- the loss / n_micro). A backward (B) receives the gradient of that result from the next
-- stage (the last one starts from its loss), backpropagates with it and sends the
-- gradient of its received activations back. The tape holds every micro-batch in flight;
-- each backward runs only the nodes of its own micro-batch (engine/autograd.c).
-- Schedules (parallel.pipeline_schedule):
--   gpipe  every forward, then every backward in reverse order;
--   1f1b   stage s runs S - 1 - s forwards ahead, then alternates one forward and one
--          backward, then drains the backwards: at most S - s micro-batches in flight.
-- Sends are asynchronous (awaited at the end of the step; each handle keeps its tensor
-- alive) and receives blocking, so no two stages can wait on each other. The gradients
-- of a micro-batch add into the parameters' .grad as in gradient accumulation: the step
-- equals the single-process one.
local ffi = require("ffi")
local tffi = require("tetra.ffi")
local F = require("tetra.nn.functional")

local C = ffi.C
local free = F.free
local M = {}

-- A user error raised once (by rank 0) when every rank hits it alike.
local function fail(fmt, ...)
  require("tetra.dist").fail(string.format(fmt, ...))
end

-- Array (one entry per stage) of block counts: `counts` (parallel.pipeline_stages) when
-- given, else n_layers split uniformly with the remainder on the first stages. Every
-- stage holds at least one block.
function M.stage_layers(n_layers, stages, counts)
  local out, total = {}, 0
  for s = 1, stages do
    out[s] = counts and counts[s] or
             math.floor(n_layers / stages) + ((s - 1) < n_layers % stages and 1 or 0)
    total = total + out[s]
    if out[s] < 1 then
      fail("pipeline parallelism: stage %d would hold %d blocks (model.n_layers %d over " ..
           "parallel.pipeline_parallel_size %d); every stage needs at least one",
           s - 1, out[s], n_layers, stages)
    end
  end
  if total ~= n_layers then
    fail("parallel.pipeline_stages: the layer counts add up to %d, model.n_layers is %d",
         total, n_layers)
  end
  return out
end

-- The ops of stage `stage` (0-based) of `stages` for n_micro micro-batches: an array of
-- { "F" | "B", micro } (micro 0-based), in the order the stage runs them.
function M.schedule(kind, stages, stage, n_micro)
  local ops = {}
  local function fwd(m) ops[#ops + 1] = { "F", m } end
  local function bwd(m) ops[#ops + 1] = { "B", m } end
  if kind == "gpipe" then
    for m = 0, n_micro - 1 do fwd(m) end
    for m = n_micro - 1, 0, -1 do bwd(m) end
  elseif kind == "1f1b" then
    local warmup = math.min(stages - 1 - stage, n_micro)
    for m = 0, warmup - 1 do fwd(m) end
    for m = 0, n_micro - warmup - 1 do
      fwd(warmup + m)
      bwd(m)
    end
    for m = n_micro - warmup, n_micro - 1 do bwd(m) end
  else
    fail("parallel.pipeline_schedule=%s is not implemented (gpipe or 1f1b)", tostring(kind))
  end
  return ops
end

-- Removes child `name` from module (the parameters go with it).
local function drop(module, name)
  module[name] = nil
  local names = {}
  for _, n in ipairs(module._child_names) do
    if n ~= name then names[#names + 1] = n end
  end
  module._child_names = names
end

local Pipeline = {}
Pipeline.__index = Pipeline

-- Keeps this stage's part of model (built whole from the seed) and returns the stage's
-- runner; model.pipeline is set to it. The kept blocks keep their names
-- (layers.<index in the whole model>). cfg: the run's config (model.n_layers,
-- parallel.pipeline_stages, parallel.pipeline_schedule, model.dim, model.seq_len).
function M.split(model, group, cfg)
  local p = cfg.parallel or {}
  local S, s = group.size, group.rank
  local counts = M.stage_layers(cfg.model.n_layers, S, p.pipeline_stages)
  local first = 0
  for i = 1, s do first = first + counts[i] end
  local layers, kept = model.layers, {}
  for i = 1, #layers do
    local idx = i - 1
    if idx >= first and idx < first + counts[s + 1] then
      kept[#kept + 1] = { tostring(idx), layers[i] }
    else
      layers[tostring(idx)] = nil
    end
    layers[i] = nil
  end
  layers._child_names = {}
  for j, nm in ipairs(kept) do
    layers[j] = nm[2]
    layers._child_names[j] = nm[1]
  end
  local self = setmetatable({ model = model, group = group, stage = s, stages = S,
                              is_first = s == 0, is_last = s == S - 1,
                              first_layer = first, n_layers = counts[s + 1],
                              kind = p.pipeline_schedule or "1f1b",
                              dim = cfg.model.dim }, Pipeline)
  if not self.is_first then drop(model, "tok_embeddings") end
  if not self.is_last then
    drop(model, "norm")
    drop(model, "output")
  end
  model.pipeline = self
  return self
end

-- Tags keep each micro-batch's activation and gradient messages apart.
local function act_tag(m) return 2 * m end
local function grad_tag(m) return 2 * m + 1 end

-- Micro-batch m of tokens (B, T + 1): rows [m n, (m + 1) n), contiguous.
local function micro_rows(tokens, m, n)
  if n == tonumber(tokens._shape[0]) then return tokens end
  local v = F.narrow(tokens, 0, m * n, n)
  local c = F.contiguous(v)
  free(v)
  return c
end

-- The input of this stage for tokens (b, T + 1): the embedded ids on the first stage
-- (and the targets on the last), else the activations received from the previous stage
-- as a leaf that requires grad (its .grad is what goes back). With `record` false the
-- received tensor is a plain leaf (no tape).
function Pipeline:stage_input(tokens, m, record)
  if self.is_first or self.is_last then
    local ids, targets = require("tetra.train").inputs_targets(tokens)
    if not self.is_last then free(targets); targets = nil end
    if not self.is_first then
      free(ids)
      return self:receive(tokens, m, record), targets
    end
    local x = self.model:embed(ids)
    free(ids)
    return x, targets
  end
  return self:receive(tokens, m, record), nil
end

-- The activations (b, T, dim) of micro-batch m from the previous stage.
function Pipeline:receive(tokens, m, record)
  local x = F.empty({ tonumber(tokens._shape[0]), tonumber(tokens._shape[1]) - 1, self.dim },
                    C.TT_F32)
  self.group:recv(x, self.stage - 1, act_tag(m))
  if record then tffi.check(C.tt_set_requires_grad(x, 1)) end
  return x
end

-- Runs this stage's blocks on x; the last stage returns the mean loss against targets,
-- the others send the result on and return it.
function Pipeline:stage_output(x, targets, m)
  local h = self.model.layers(x)
  if not self.is_last then
    self.pending[#self.pending + 1] = self.group:send_async(h, self.stage + 1, act_tag(m))
    return h
  end
  local logits = self.model:head(h)
  free(h)
  local loss = self.model:cross_entropy(logits, targets)
  free(logits); free(targets)
  return loss
end

-- Forward and backward of tokens' n_micro micro-batches (the rows of this DP rank),
-- following the schedule; the parameters' .grad accumulate the gradient of the mean
-- micro-batch loss. ddp:before_backward(is_last) runs before each backward (DP armed
-- for the last one). Returns the sum of the micro-batch losses (the same on every
-- stage: the last one broadcasts it).
function Pipeline:train_step(tokens, n_micro, ddp)
  local rows = tonumber(tokens._shape[0]) / n_micro
  local inputs, roots, loss_sum = {}, {}, 0.0
  self.pending = {}
  local ops = M.schedule(self.kind, self.stages, self.stage, n_micro)
  local n_backward = 0
  for _, op in ipairs(ops) do
    local m = op[2]
    if op[1] == "F" then
      local mb = micro_rows(tokens, m, rows)
      local x, targets = self:stage_input(mb, m, true)
      if mb ~= tokens then free(mb) end
      local y = self:stage_output(x, targets, m)
      if self.is_last then
        loss_sum = loss_sum + F.item(y)
        if n_micro > 1 then
          local mean = F.scale(y, 1.0 / n_micro)
          free(y)
          y = mean
        end
      end
      if self.is_first then free(x) else inputs[m] = x end
      roots[m] = y
    else
      n_backward = n_backward + 1
      ddp:before_backward(n_backward == n_micro)
      local y = roots[m]
      if self.is_last then
        F.backward(y)
      else
        local g = F.empty({ tonumber(y._shape[0]), tonumber(y._shape[1]), self.dim },
                          C.TT_F32)
        self.group:recv(g, self.stage + 1, grad_tag(m))
        tffi.check(C.tt_backward_with(y, g))
        free(g)
      end
      free(y)
      roots[m] = nil
      if not self.is_first then   -- the handle keeps x.grad alive until the send ends
        local x = inputs[m]
        self.pending[#self.pending + 1] = self.group:send_async(x.grad, self.stage - 1,
                                                                grad_tag(m))
        free(x)
        inputs[m] = nil
      end
    end
  end
  for _, h in ipairs(self.pending) do h:wait() end
  self.pending = nil
  return self:share_loss(loss_sum)
end

-- x (a Lua number known to the last stage) on every stage. It travels as a (hi, lo)
-- pair of floats, so the double does not round to float.
function Pipeline:share_loss(x)
  local hi = tonumber(ffi.new("float", x))
  local t = require("tetra.tensor").from_table({ hi, x - hi })
  self.group:broadcast(t, self.stages - 1)
  local v = C.tt_tensor_get(t, 0) + C.tt_tensor_get(t, 1)
  free(t)
  return v
end

-- Mean loss of tokens (b, T + 1) through every stage, without the tape (evaluation).
function Pipeline:forward_loss(tokens)
  return F.no_grad(function()
    self.pending = {}
    local x, targets = self:stage_input(tokens, 0, false)
    local y = self:stage_output(x, targets, 0)
    local loss = self.is_last and F.item(y) or 0.0
    free(x)
    for _, h in ipairs(self.pending) do h:wait() end
    self.pending = nil
    free(y)
    return self:share_loss(loss)
  end)
end

-- The gradient norm of the whole model (each stage holds its own parameters: the
-- squares add over the pp group); clips like tt_clip_grad_norm. Returns the norm.
function Pipeline:clip_grad_norm(params, max_norm)
  return require("tetra.parallel.tensor").clip_grad_norm(params, {}, self.group, max_norm)
end

-- Routes opt:clip_grad_norm through the norm over every stage.
function Pipeline:attach_optimizer(opt)
  local pipe = self
  opt.clip_grad_norm = function(o, max_norm) return pipe:clip_grad_norm(o.params, max_norm) end
end

return M
