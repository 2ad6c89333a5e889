-- tetra.parallel.pipeline: pipeline parallelism over the mesh's pp group.
--
--   local pp = tetra.parallel.pipeline
--   pp.stage_layers(n_layers, stages, counts)   -- blocks per stage (uniform, or counts)
--   pp.schedule(kind, stages, stage, n_micro)   -- this stage's ops: { "F"|"B", micro }
--   pp.rounds(ops), pp.transfer_groups(...)     -- the interleaved schedule's rounds
--   pp.split(model, plan.pipeline, group, cfg)  -- keeps this stage's part of model
--   local pipe = pp.runner(par, cfg)            -- the pipelined step (tetra.parallel.step)
--   pipe:train_step(tokens, n_micro, before_backward) -> summed micro-batch losses (a
--                                                        one-value device tensor)
--   pipe:forward_loss(tokens)                   -- no tape: the mean loss of one batch
--
-- Stage s of S holds a contiguous run of the model's blocks (uniformly: n_layers / S
-- each, the first n_layers % S stages one more; or parallel.pipeline_stages), the first
-- stage the modules of the plan's `first` list (the embedding), the last one those of
-- `last` (the final norm, the head) and the loss. The model runs as three parts:
-- model:embed(ids, positions) -> (B, T, dim), the blocks (a ModuleList the plan names,
-- called with (x, positions)) and model:head(h) -> logits. Every rank builds the whole
-- model from the same seed, then drops what other stages hold, so each stage's weights
-- equal the single-process ones. A head that reuses the embedding's matrix (tied) keeps
-- its copy on the last stage; the gradients of the two copies are summed over the first
-- and last stage after backward (tetra.parallel), so both take the same update.
--
-- One optimizer step: every stage sees the same micro-batches, sliced the same way for
-- context parallelism. A forward (F) receives the activations from the previous stage
-- (the first stage embeds the tokens), runs its blocks and sends the result to the next
-- stage (the last one computes the loss / n_micro). A backward (B) receives the gradient
-- of that result from the next stage (the last one starts from its loss), backpropagates
-- with it and sends the gradient of its received activations back. The tape holds every
-- micro-batch in flight; each backward runs only the nodes of its own micro-batch
-- (engine/core/autograd.c). Under tensor parallelism each tensor-parallel rank talks to its
-- counterpart (the pp group joins ranks of equal tp, cp and dp coordinates); with
-- sequence parallelism the activations are this rank's slice of the sequence.
-- Schedules (parallel.pipeline_schedule):
--   gpipe  every forward, then every backward in reverse order;
--   1f1b   stage s runs S - 1 - s forwards ahead, then alternates one forward and one
--          backward, then drains the backwards: at most S - s micro-batches in flight.
--   interleaved_1f1b  Megatron-LM's: v chunks per stage (virtual stages), more forwards
--          ahead, a bubble v times smaller; its transfers go in rounds (M.rounds).
-- Sends are asynchronous (awaited at the end of the step; each handle keeps its tensor
-- alive) and receives blocking, so no two stages can wait on each other; a send goes out
-- with the receive after it, or with its round's (interleaved), as one NCCL group. The gradients
-- of a micro-batch add into the parameters' .grad as in gradient accumulation: the step
-- equals the single-process one.
local ffi = require("ffi")
local tffi = require("tetra.ffi")
local F = require("tetra.nn.functional")
local metrics = require("tetra.obs.metrics")
local trace = require("tetra.obs.trace")
local T = require("tetra.tensor")
local timers = require("tetra.obs.timer")
local micro = require("tetra.parallel.micro")

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
-- { "F" | "B", micro, chunk } (micro and chunk 0-based), in the order the stage runs
-- them. chunk is the stage's model chunk (always 0 but for interleaved_1f1b, where each
-- stage holds `virtual` chunks: chunk c of stage s is virtual stage c * stages + s).
function M.schedule(kind, stages, stage, n_micro, virtual)
  local ops = {}
  local function fwd(m, c) ops[#ops + 1] = { "F", m, c or 0 } end
  local function bwd(m, c) ops[#ops + 1] = { "B", m, c or 0 } end
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
  elseif kind == "interleaved_1f1b" then
    -- Megatron's interleaved schedule: micro-batches go through the chunks in groups of
    -- `stages`; the k-th forward of a stage is micro-batch (k // (stages v)) stages +
    -- k % stages on chunk (k // stages) % v, its k-th backward the same micro-batch on
    -- the chunks in reverse. More warm-up forwards than 1F1B, a bubble v times smaller.
    local v = virtual or 1
    if n_micro % stages ~= 0 then
      fail("parallel.pipeline_schedule=interleaved_1f1b: the micro-batches " ..
           "(train.gradient_accumulation_steps = %d) must be a multiple of " ..
           "parallel.pipeline_parallel_size (%d)", n_micro, stages)
    end
    local total = n_micro * v
    local function micro(k) return math.floor(k / (stages * v)) * stages + k % stages end
    local function chunk(k) return math.floor(k / stages) % v end
    local warmup = math.min(total, (stages - stage - 1) * 2 + (v - 1) * stages)
    for k = 0, warmup - 1 do fwd(micro(k), chunk(k)) end
    for i = 0, total - warmup - 1 do
      fwd(micro(warmup + i), chunk(warmup + i))
      bwd(micro(i), v - 1 - chunk(i))
    end
    for k = total - warmup, total - 1 do bwd(micro(k), v - 1 - chunk(k)) end
  else
    fail("parallel.pipeline_schedule=%s is not implemented (gpipe, 1f1b or " ..
         "interleaved_1f1b)", tostring(kind))
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

-- Keeps this stage's part of model (built whole from the seed). stages: the plan's
-- pipeline entry { blocks =, first =, last = }. With parallel.virtual_pipeline_size v the
-- blocks are cut into stages x v runs and this stage keeps runs s, s + stages, ...
-- (interleaved). The kept blocks keep their names (<blocks>.<index in the whole model>).
-- Returns the stage's description { stage, stages, virtual, is_first, is_last, blocks
-- (the ModuleList), chunks (per chunk, a ModuleList runner of its blocks) }.
function M.split(model, stages, group, cfg)
  local p = cfg.parallel or {}
  local S, s = group.size, group.rank
  local v = p.virtual_pipeline_size or 1
  local whole = model:parameters()
  local blocks = model:get(stages.blocks)
  local counts = M.stage_layers(#blocks, S * v, p.pipeline_stages)
  local owner, first = {}, 0   -- block index -> chunk of this stage holding it
  for vs = 0, S * v - 1 do
    if vs % S == s then
      for i = first, first + counts[vs + 1] - 1 do owner[i] = math.floor(vs / S) end
    end
    first = first + counts[vs + 1]
  end
  local kept, chunks = {}, {}
  local ModuleList = require("tetra.nn.layers").ModuleList
  for c = 0, v - 1 do chunks[c] = ModuleList() end
  for i = 1, #blocks do
    local idx = i - 1
    if owner[idx] then
      kept[#kept + 1] = { tostring(idx), blocks[i] }
      local run = chunks[owner[idx]]
      run[#run + 1] = blocks[i]   -- a runner only: not registered, its blocks stay in model
    else
      blocks[tostring(idx)] = nil
    end
    blocks[i] = nil
  end
  blocks._child_names = {}
  for j, nm in ipairs(kept) do
    blocks[j] = nm[2]
    blocks._child_names[j] = nm[1]
  end
  local info = { stage = s, stages = S, virtual = v, is_first = s == 0, is_last = s == S - 1,
                 blocks = blocks, chunks = chunks }
  if not info.is_first then
    for _, name in ipairs(stages.first or {}) do drop(model, name) end
  end
  if not info.is_last then
    for _, name in ipairs(stages.last or {}) do drop(model, name) end
  end
  -- The other stages' parameters are released now: left to the Lua GC they stay
  -- allocated for as long as a stale reference on the Lua stack keeps them reachable
  -- (up to the whole model on every rank). A matrix this stage still uses (a tied
  -- head's) is kept.
  local kept = {}
  for _, t in ipairs(model:parameters()) do kept[T.key(t)] = true end
  for _, t in ipairs(whole) do
    if not kept[T.key(t)] then free(t) end
  end
  return info
end

local Pipeline = {}
Pipeline.__index = Pipeline

-- The runner of this stage for the applied parallelism `par` (tetra.parallel.apply).
function M.runner(par, cfg)
  local st = par.stage
  return setmetatable({ par = par, model = par.model, group = par.mesh.pp, stage = st.stage,
                        stages = st.stages, virtual = st.virtual, chunks = st.chunks,
                        n_virtual = st.stages * st.virtual,
                        kind = (cfg.parallel or {}).pipeline_schedule or "1f1b",
                        dim = cfg.model.dim }, Pipeline)
end

-- A send whose schedule op is followed by one that starts with a receive (self.pair_next,
-- set by train_step) waits for that receive and goes out with it as one pair that
-- progresses together (Group:sendrecv): on GPUs NCCL runs a group's transfers in the
-- order they were queued on its stream, each send waiting for its receiver, so under
-- 1F1B two neighbours that each send before they receive (stage s its next micro-batch's
-- activations, stage s + 1 the last one's gradient) would wait on each other for good.
-- This pairs them as Megatron-LM's send-forward-receive-backward does; no compute comes
-- between, so nothing waits longer. Any other send goes out at once (so always outside
-- train_step, which alone sets pair_next: evaluation and generation). Handles go to
-- self.pending, waited for at the end (each holds its tensor). `own`: t is this call's to
-- free once sent (a gradient read from .grad, a reference of its own); else the caller
-- frees it later (activations, after their backward, which comes after the receive).
function Pipeline:send(t, peer, tag, own)
  if self.round_sends then   -- (interleaved: the round's transfers go out together)
    local r = self.round_sends
    r[#r + 1] = { t, peer, tag, own = own }
    return
  end
  self:flush_send()
  self.deferred = { t = t, peer = peer, tag = tag, own = own }
  if not self.pair_next then self:flush_send() end
end

function Pipeline:flush_send()
  local d = self.deferred
  if not d then return end
  self.deferred = nil
  self.pending[#self.pending + 1] = self.group:send_async(d.t, d.peer, d.tag)
  if d.own then free(d.t) end
end

-- The f32 tensor of `shape` that peer sends with tag: the one the round before already
-- received (interleaved), or a new one received now (with the deferred send, if any).
function Pipeline:recv(shape, peer, tag)
  local got = self.prefetched and self.prefetched[tag]
  if got then   -- (received with the round before)
    self.prefetched[tag] = nil
    return got
  end
  local t = F.empty(shape, C.TT_F32, self.par.device)
  local d = self.deferred
  if not d then return self.group:recv(t, peer, tag) end
  self.deferred = nil
  self.pending[#self.pending + 1] = self.group:sendrecv(d.t, d.peer, d.tag, t, peer, tag)
  if d.own then free(d.t) end
  return t
end

-- The shape of the activations (and their gradients) of micro-batches of `rows` rows of
-- this rank's ids of length t: (rows, t, dim), t cut by sequence parallelism.
function Pipeline:activation_shape(rows, t)
  return { rows, self.par:activation_len(t), self.dim }
end

-- Messages are told apart by micro-batch, receiving virtual stage and direction.
function Pipeline:act_tag(m, vs) return 2 * (m * self.n_virtual + vs) end
function Pipeline:grad_tag(m, vs) return 2 * (m * self.n_virtual + vs) + 1 end

-- Forward of chunk c of this stage (virtual stage vs = c stages + stage) for micro-batch
-- m of tokens (b, T + 1): returns the chunk's input (the received activations; nil on
-- virtual stage 0, which embeds the tokens) and its output (the mean loss on the last
-- virtual stage; else the activations, already on their way to the next). The
-- activations are (b, t, dim), t this rank's part of the sequence (context and sequence
-- parallelism cut it). With `logits` (generation) every rank takes the whole sequence
-- (context parallelism does not cut it) and the last virtual stage returns the head's
-- logits instead of the loss.
function Pipeline:forward(tokens, m, c, record, logits_wanted)
  local vs = c * self.stages + self.stage
  local ids, targets, positions
  if logits_wanted then
    ids, targets = F.inputs_targets(tokens)
  else
    ids, targets, positions = self.par:inputs(tokens)
  end
  local x, h
  if vs == 0 then
    h = self.model:embed(ids, positions)
  else
    x = self:recv(self:activation_shape(tonumber(ids._shape[0]), tonumber(ids._shape[1])),
                  (vs - 1) % self.stages, self:act_tag(m, vs))
    if record then tffi.check(C.tt_set_requires_grad(x, 1)) end
  end
  local y = self.chunks[c](h or x, positions)
  if h then free(h) end
  free(ids); free(positions)
  if vs < self.n_virtual - 1 then
    free(targets)
    self:send(y, (vs + 1) % self.stages, self:act_tag(m, vs + 1))
    return x, y
  end
  local logits = self.model:head(y)
  free(y)
  if logits_wanted then
    free(targets)
    return x, logits
  end
  local loss = self.par:loss(logits, targets)
  free(logits); free(targets)
  return x, loss
end

-- Forward and backward of tokens' n_micro micro-batches (the rows of this DP rank),
-- following the schedule; the parameters' .grad accumulate the gradient of the mean
-- micro-batch loss, times the fp16 loss scale (amp_ctx:scale_loss, tetra.optim.amp).
-- before_backward(is_last) runs before each backward. Returns the sum of the micro-batch losses, a one-value tensor on
-- the device, the same on every stage (the last one broadcasts it); nothing waits for the
-- device. self.forward_marks: pairs of self.timer's marks (tetra.obs.timer)
-- around each forward, whose seconds (receives' waits left out) the step breakdown adds.
function Pipeline:train_step(tokens, n_micro, before_backward, amp_ctx)
  local rows = tonumber(tokens._shape[0]) / n_micro
  local inputs, roots, loss_sum = {}, {}, nil
  self.pending, self.deferred, self.pair_next = {}, nil, nil
  local ops = M.schedule(self.kind, self.stages, self.stage, n_micro, self.virtual)
  local n_backward, last_vs = 0, self.n_virtual - 1
  self.timer = self.timer or timers.new(self.par.device)
  local timer, marks = self.timer, {}
  self.forward_marks = marks
  -- Whether op i + 1 starts with a receive (a forward past virtual stage 0 receives its
  -- activations, a backward before the last its gradient): op i's send then pairs with it.
  local function starts_with_recv(op)
    if not op then return false end
    local v = op[3] * self.stages + self.stage
    if op[1] == "F" then return v ~= 0 end
    return v ~= last_vs
  end
  local function run(op)
    local m, c = op[2], op[3]
    local vs = c * self.stages + self.stage
    local key = m * self.virtual + c
    if op[1] == "F" then
      local mb = micro.rows(tokens, m, rows)
      local f0, w0 = timer:mark(), metrics.now()
      local x, y = self:forward(mb, m, c, true)
      marks[#marks + 1] = f0
      marks[#marks + 1] = timer:mark()
      if trace.on then trace.span("F", w0, metrics.now(), { micro = m, chunk = c }) end
      if mb ~= tokens then free(mb) end
      if vs == last_vs then
        loss_sum = micro.add_loss(loss_sum, y)
        local scaled = amp_ctx:scale_loss(y, n_micro)
        if scaled ~= y then
          free(y)
          y = scaled
        end
      end
      inputs[key], roots[key] = x, y
    else
      n_backward = n_backward + 1
      before_backward(n_backward == #ops / 2)
      local b0 = metrics.now()
      local y = roots[key]
      if vs == last_vs then
        F.backward(y)
      else
        local g = self:recv(y:shape(),
                            (vs + 1) % self.stages, self:grad_tag(m, vs))
        F.backward_with(y, g)
        free(g)
      end
      free(y)
      roots[key] = nil
      if trace.on then trace.span("B", b0, metrics.now(), { micro = m, chunk = c }) end
      local x = inputs[key]
      if x then   -- (the send keeps x.grad alive until it ends)
        self:send(x.grad, (vs - 1) % self.stages, self:grad_tag(m, vs - 1), true)
        free(x)
        inputs[key] = nil
      end
    end
  end
  -- (1F1B and GPipe keep the pairing: on GPUs the compute stream waits for a whole
  -- group when it is queued, and a round's group holds the next forward's activations
  -- and the next backward's gradient, so that forward would wait for the gradient too)
  if self.kind == "interleaved_1f1b" then
    self:run_rounds(ops, run, tokens, rows)
  else
    for i, op in ipairs(ops) do
      self.pair_next = starts_with_recv(ops[i + 1])
      run(op)
    end
  end
  self.pair_next = nil   -- (the last op's send went out at once: nothing follows it)
  for _, h in ipairs(self.pending) do h:wait() end
  self.pending = nil
  -- the last stage's sum, on every stage of the pipeline
  local shared = loss_sum or F.empty({}, C.TT_F32, self.par.device)
  self.group:broadcast(shared, self.stages - 1)
  return shared
end

-- The interleaved schedule's ops in rounds, as Megatron-LM runs them: the warm-up's
-- forwards one a round, then a forward and a backward a round, then the cool-down's
-- backwards. Between two rounds one group of transfers (Group:p2p: one NCCL group)
-- sends what the round made (activations to the next stage, gradients to the previous)
-- and receives what the next round needs, so that the rounds of neighbouring stages
-- meet one for one: under NCCL's order a send waits for its receiver and a group ends
-- only when all of it has, and one send paired with the next receive (1F1B's rule)
-- left two stages each waiting for the other (tests/dist/pipeline_in_order.sh). A stage
-- whose warm-up holds every forward (as many micro-batches as stages) has no
-- forward-backward round: there the last forward's round pairs with nothing, as in
-- Megatron-LM. tests/lua/pipeline_spec.lua checks under that order that no stage waits
-- for good.
function M.rounds(ops)
  local first_b, n_b = #ops + 1, 0
  for k = #ops, 1, -1 do
    if ops[k][1] == "B" then first_b, n_b = k, n_b + 1 end
  end
  local warmup = first_b == n_b + 1 and n_b or math.max(0, first_b - 2)
  local rounds, k = {}, 1
  while k <= #ops do
    if k > warmup and ops[k][1] == "F" and ops[k + 1] and ops[k + 1][1] == "B" then
      rounds[#rounds + 1] = { ops[k], ops[k + 1] }
      k = k + 2
    else
      rounds[#rounds + 1] = { ops[k] }
      k = k + 1
    end
  end
  return rounds
end

-- The transfers of a round's ops with stage `stage` of `stages` (n_virtual virtual
-- stages): what they receive and what they send, as { kind = "act" | "grad", micro,
-- vs (the virtual stage the message goes to), peer }.
function M.round_needs(round, stage, stages, n_virtual)
  local recvs, sends = {}, {}
  for _, op in ipairs(round) do
    local m, vs = op[2], op[3] * stages + stage
    if op[1] == "F" then
      if vs > 0 then
        recvs[#recvs + 1] = { kind = "act", micro = m, vs = vs, peer = (vs - 1) % stages }
      end
      if vs < n_virtual - 1 then
        sends[#sends + 1] = { kind = "act", micro = m, vs = vs + 1, peer = (vs + 1) % stages }
      end
    else
      if vs < n_virtual - 1 then
        recvs[#recvs + 1] = { kind = "grad", micro = m, vs = vs, peer = (vs + 1) % stages }
      end
      if vs > 0 then
        sends[#sends + 1] = { kind = "grad", micro = m, vs = vs - 1, peer = (vs - 1) % stages }
      end
    end
  end
  return recvs, sends
end

-- The groups of transfers of a stage's rounds: an array of { after = the round they follow
-- (0: before the first), sends, recvs } (round_needs' entries), in the order they go out.
function M.transfer_groups(rounds, stage, stages, n_virtual)
  local out = { { after = 0, sends = {}, recvs = (M.round_needs(rounds[1], stage, stages,
                                                                n_virtual)) } }
  for i, round in ipairs(rounds) do
    local _, sends = M.round_needs(round, stage, stages, n_virtual)
    local nxt = rounds[i + 1]
    local recvs = nxt and (M.round_needs(nxt, stage, stages, n_virtual)) or {}
    out[#out + 1] = { after = i, sends = sends, recvs = recvs }
  end
  return out
end

function Pipeline:tag_of(x)
  return x.kind == "act" and self:act_tag(x.micro, x.vs) or self:grad_tag(x.micro, x.vs)
end

function Pipeline:run_rounds(ops, run, tokens, rows)
  -- every activation (and its gradient) has this shape
  local shape = self:activation_shape(rows, self.par:ids_len(tonumber(tokens._shape[1]) - 1))
  local rounds = M.rounds(ops)
  local groups = M.transfer_groups(rounds, self.stage, self.stages, self.n_virtual)
  self.prefetched = {}
  local made = {}   -- what the rounds sent (Pipeline:send), by tag
  local function exchange(g)
    local sends, recvs = {}, {}
    for _, x in ipairs(g.sends) do
      local tag = self:tag_of(x)
      sends[#sends + 1] = made[tag]
      made[tag] = nil
    end
    for _, r in ipairs(g.recvs) do
      local t, tag = F.empty(shape, C.TT_F32, self.par.device), self:tag_of(r)
      self.prefetched[tag] = t
      recvs[#recvs + 1] = { t, r.peer, tag }
    end
    if #sends == 0 and #recvs == 0 then return end
    for _, h in ipairs(self.group:p2p(sends, recvs)) do self.pending[#self.pending + 1] = h end
    for _, x in ipairs(sends) do
      if x.own then free(x[1]) end
    end
  end
  local next_group = 1
  for i = 0, #rounds do
    if i > 0 then
      self.round_sends = {}
      for _, op in ipairs(rounds[i]) do run(op) end
      for _, x in ipairs(self.round_sends) do made[x[3]] = x end
      self.round_sends = nil
    end
    while groups[next_group] and groups[next_group].after == i do
      exchange(groups[next_group])
      next_group = next_group + 1
    end
  end
  self.prefetched = nil
end

-- The seconds the last train_step's forwards computed.
function Pipeline:forward_seconds() return self.timer:total(self.forward_marks or {}) end

-- x (a Lua number known to the last stage: a loss, a sampled token) on every stage. It
-- travels as a (hi, lo) pair of floats, so the double does not round to float.
function Pipeline:share_number(x)
  local hi = tonumber(ffi.new("float", x))
  local t = require("tetra.tensor").from_table({ hi, x - hi })
  self.group:broadcast(t, self.stages - 1)
  local v = C.tt_tensor_get(t, 0) + C.tt_tensor_get(t, 1)
  free(t)
  return v
end

-- Tokens (b, T + 1) through this stage's chunks, without the tape: the last virtual
-- stage's output (its loss, or with logits_wanted its logits), nil on the other stages.
local function forward_chunks(self, tokens, logits_wanted)
  self.pending, self.deferred, self.pair_next = {}, nil, nil
  local out
  for c = 0, self.virtual - 1 do
    local x, y = self:forward(tokens, 0, c, false, logits_wanted)
    free(x)
    if c * self.stages + self.stage == self.n_virtual - 1 then out = y else free(y) end
  end
  for _, h in ipairs(self.pending) do h:wait() end
  self.pending = nil
  return out
end

-- Mean loss of tokens (b, T + 1) through every stage, without the tape (evaluation).
function Pipeline:forward_loss(tokens)
  return F.no_grad(function()
    local y = forward_chunks(self, tokens, false)
    local loss = y and F.item(y) or 0.0
    free(y)
    return self:share_number(loss)
  end)
end

-- The head's logits of tokens (b, T + 1; the last column is not read) through every
-- stage, without the tape (generation): (b, T, this rank's vocabulary columns) on the
-- last stage, nil on the others. Every rank of the pipeline calls it alike.
function Pipeline:forward_logits(tokens)
  return F.no_grad(function() return forward_chunks(self, tokens, true) end)
end

return M
