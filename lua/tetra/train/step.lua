-- tetra.train.step: one optimizer step, the same for every layout, top to bottom:
--   global batch (train.batch_size sequences) at this step's data position
--   -> train.device -> this data-parallel rank's rows
--   -> the step strategy (tetra.parallel.step: plain, or pipelined over the stages) runs
--      forward and backward of train.gradient_accumulation_steps micro-batches and leaves
--      the gradients of the global batch's mean loss in place (x the fp16 scale)
--   -> fp16: grads / loss scale, inf/NaN check agreed over every rank
--   -> clip to max_grad_norm by the norm of the whole model (tetra.parallel, from the
--      parameters' placements) -> AdamW with the scheduled lr, unless the grads were not
--      finite: then the step is skipped (and the fp16 scale backs off)
--   -> the loss guard's verdict -> zero grads -> one metrics record.
-- Every piece of state the step reads or writes is in env, the table tetra.train.setup
-- builds; step.run(env) is env.step(). With AdamW the step waits for the device once:
-- the loss, the norm and found_inf come back in one read of the optimizer's stats.
-- After train.cuda_graphs' warm-up, forward, backward and the update are one captured
-- CUDA graph (tetra.train.graph) replayed each step (graph_step).
--
-- The update of a hand-written loop is here too (update, update_launch, update_finish):
-- tetra.optim.amp gives the precision's parts (the unscale, the scaler's verdict, the
-- weights' cached copies), this module runs them around the optimizer.
local tffi = require("tetra.ffi")
local C = tffi.C
local F = require("tetra.nn.functional")
local T = require("tetra.tensor")
local graph = require("tetra.train.graph")
local metrics = require("tetra.obs.metrics")
local telemetry = require("tetra.obs.telemetry")
local trace = require("tetra.obs.trace")
local ops = require("tetra.obs.ops")
local user_error = require("tetra.util.errors").raise

local step = {}

local free = F.free
local to_dev = T.moved

-- -- The optimizer update under a precision --------------------------------------------

-- optimizer_fn() between ctx:before_update and ctx:after_update (the weights' cached
-- low-precision copies marked written).
local function optimizer_update(ctx, optimizer_fn, opt)
  local u = ctx:before_update(opt)
  optimizer_fn()
  ctx:after_update(u)
end

-- ctx's unscale (fp16), clip_fn() (may be nil; returns the gradient norm), optimizer_fn()
-- unless the grads overflowed, the scaler's update: one step of a hand-written loop.
-- Returns skipped, norm. group: the ranks that agree the overflow verdict. opt
-- (optional): the optimizer, when it keeps the step's scalars on the device (AdamW):
-- then the unscale's found_inf and the norm come back in one read, made by clip_fn (or
-- here when there is none).
function step.update(ctx, params, optimizer_fn, clip_fn, group, opt)
  if opt and not opt.read_stats then opt = nil end
  local found = ctx:unscale(params, group, opt)
  local norm = 0 / 0
  if found == nil then   -- on the device: the clip reads it with the norm
    norm = clip_fn and clip_fn() or opt:read_stats().grad_norm
    found = opt.last_stats.found_inf
    if found then norm = 0 / 0 end   -- an overflow, as when the clip does not run
  elseif not found and clip_fn then
    norm = clip_fn()
    found = norm ~= norm or norm == math.huge
  end
  local skipped = ctx:update(found)
  if not skipped then optimizer_update(ctx, optimizer_fn, opt) elseif opt then opt:end_step() end
  return skipped, norm
end

-- step.update without a wait for the device in the middle, for an optimizer that keeps
-- the step's scalars on the device (AdamW): update_launch runs the unscale (fp16:
-- found_inf into the stats), clip_async_fn (the norm and the clip coefficient into the
-- stats) and the update, which the device skips when found_inf is set (a gradient, the
-- norm or a loss put in the stats by tt_step_stats_set_loss was not finite); update_finish
-- then makes the step's one read and returns skipped, norm, loss (the stats' loss).
function step.update_launch(ctx, params, optimizer_fn, clip_async_fn, group, opt)
  ctx:unscale(params, group, opt)
  if clip_async_fn then clip_async_fn() end
  optimizer_update(ctx, optimizer_fn, opt)
end

-- A spike (the loss above the stats' limit) skipped the update without counting as an
-- overflow: the scaler does not see the step (as when the host skips it before unscaling).
function step.update_finish(ctx, opt)
  local s = opt:read_stats()
  if s.found_inf then opt:uncount_step() end   -- the device skipped the update
  local skipped
  if s.spike then
    skipped = true
    ctx:skip()
  else
    skipped = ctx:update(s.found_inf)
  end
  return skipped, s.found_inf and 0 / 0 or s.grad_norm, s.loss
end

-- -- The pieces of a training step -----------------------------------------------------

-- Mean cross-entropy of an unsplit model on tokens (b, T + 1); the logits are freed at
-- once. (A split model's loss is its step strategy's: tetra.parallel.step.)
function step.loss(model, tokens)
  local ids, targets = F.inputs_targets(tokens)
  local logits = model(ids)                         -- (b, T, V)
  local loss = F.cross_entropy(logits, targets)
  free(logits); free(ids); free(targets)
  return loss
end

-- The norm of the whole model's gradients, clipped to max_norm: local unless some
-- parameters are split or sharded (env.split_norm).
local function clip(env, max_norm)
  if env.split_norm then
    return env.par:clip_grad_norm(env.optimizer, max_norm, env.ddp.shards)
  end
  return env.optimizer:clip_grad_norm(max_norm)
end

-- The same, leaving the norm on the device (AdamW).
local function clip_async(env, max_norm)
  if env.split_norm then
    env.par:clip_grad_norm(env.optimizer, max_norm, env.ddp.shards, true)
  else
    env.optimizer:clip_grad_norm_async(max_norm)
  end
end

-- The loss guard's reasons, ordered by how bad they are: the verdict agreed over every
-- rank is the worst, so that all of them skip (and roll back) together.
local REASONS = { "spike", "nonfinite_grad", "nonfinite_loss" }

local function agree(env, reason)
  local w = env.mesh.world
  if not w or w.size == 1 then return reason end
  local code = 0
  for i, name in ipairs(REASONS) do if reason == name then code = i end end
  env.agree_flag = env.agree_flag or T.from_table({ 0 })
  C.tt_tensor_set(env.agree_flag, 0, code)
  w:all_reduce(env.agree_flag, "max")
  return REASONS[tonumber(C.tt_tensor_get(env.agree_flag, 0))]
end

-- What the device reads of the host's decisions, written into the optimizer's stats
-- before each step (no wait): fp16's loss scale, the loss guard's spike limit.
local function write_step_inputs(env)
  local ctx, guard, optimizer = env.amp, env.guard, env.optimizer
  ctx:write_scale()
  if guard.enabled and guard.zscore > 0 and optimizer.stats_tensor then
    tffi.check(C.tt_step_stats_set_loss_limit(optimizer:stats_tensor(), guard:loss_limit()))
  end
end

-- The global batch at data position pos on the device; a captured step's goes into its
-- static input (made by the first graphed step).
-- This rank's rows of the step's batch on the device. A source that draws the global
-- batch (mock, byte) is cut to the data-parallel rank's rows on the host first, so only
-- those travel; a source that reads its own rows (data.local_rows) uploads them whole.
local function rows_of(env, host)
  if env.data.local_rows then return host end
  local rows = env.ddp:batch_slice(host)
  if rows ~= host then free(host) end   -- the rows' view keeps the storage
  return rows
end

local function upload_batch(env, pos, graphed)
  local t, data, graphs, upload = env.cfg.train, env.data, env.graphs, env.upload
  local rows = rows_of(env, data:batch(pos, t.batch_size, env.seq_len, "train"))
  local mine
  if graphed and graphs.input then
    mine = upload(rows, graphs.input)
  else
    mine = upload(rows)
    if graphed then graphs.input = mine end
  end
  return mine
end

-- The strategy's forward and backward of n micro-batches. On CUDA with AdamW, embedding
-- ids and cross-entropy targets are checked on the device during forward and backward,
-- without a wait each; the optimizer's one read of its stats reports a bad one.
local function forward_backward(env, tokens, n)
  local strategy = env.strategy
  if not env.deferred_checks then return strategy:forward_backward(tokens, n) end
  tffi.check(C.tt_cuda_set_deferred_checks(1))
  local ok, res = pcall(strategy.forward_backward, strategy, tokens, n)
  tffi.check(C.tt_cuda_set_deferred_checks(0))
  if not ok then error(res, 0) end
  return res
end

-- The mean loss over the ranks (dp x cp) into the optimizer's stats beside the norm and
-- found_inf, then fp16's unscale, the clip and the update launched (the device skips
-- the update when a gradient, the norm or the loss is not finite): no read.
local function launch_update(env, loss_sum, lr)
  local opt, mesh, ddp = env.optimizer, env.mesh, env.ddp
  local mean = F.scale(loss_sum, 1.0 / (env.accum * mesh.dpcp.size))
  free(loss_sum)
  if mesh.dpcp.size > 1 then mesh.dpcp:all_reduce(mean, "sum") end
  tffi.check(C.tt_step_stats_set_loss(opt:stats(), mean))
  free(mean)
  step.update_launch(env.amp, opt.params, function() ddp:optimizer_step(opt, lr) end,
                     function() clip_async(env, env.cfg.train.max_grad_norm) end,
                     mesh.world, opt)
end

-- The test switch train.inject_nan_step: what a diverged step looks like (a NaN loss and
-- a NaN gradient).
local function poison(env, loss_sum)
  if type(loss_sum) == "number" then loss_sum = 0 / 0
  else tffi.check(C.tt_fill_(loss_sum, 0 / 0)) end
  local p = env.optimizer.params[1]
  local g = p and p._grad
  if g ~= nil then tffi.check(C.tt_fill_(g, 0 / 0)) end
  return loss_sum
end

-- The update with one wait for the device (AdamW, a device loss): the mean loss over the
-- ranks (dp x cp) joins the norm and found_inf in the optimizer's stats; fp16's unscale,
-- the clip and the update are launched (the device skips the update when a gradient, the
-- norm or the loss is not finite, or the loss is a spike); then the one read, and the
-- verdicts from what it brought.
local function update_one_read(env, s, loss_sum)
  local ctx, guard, opt = env.amp, env.guard, env.optimizer
  launch_update(env, loss_sum, s.lr)
  s.opt1 = env.strategy.timer:mark()
  s.skipped, s.grad_norm, s.loss = step.update_finish(ctx, opt)
  s.bad = guard:judge_loss(s.loss, opt.last_stats.spike)
  if s.skipped and not s.bad and guard.enabled and not ctx.scaler then s.bad = "nonfinite_grad" end
end

-- The update with the loss on the host (SGD, or a loss already read): the guard judges
-- the loss first; fp16: unscale, then check (the verdict agreed over every rank), then
-- clip; the optimizer steps unless the grads were not finite. Under ZeRO-1
-- env.optimizer.params are this rank's grad shards: those are the ones unscaled.
local function update_host(env, s, loss_sum)
  local ctx, guard, opt, mesh = env.amp, env.guard, env.optimizer, env.mesh
  local timer = env.strategy.timer
  if type(loss_sum) ~= "number" then
    local v = F.item(loss_sum)
    free(loss_sum)
    loss_sum = v
  end
  -- The logged loss is the mean over the ranks that hold different tokens (dp x cp).
  s.loss = mesh.dpcp:mean(loss_sum / env.accum)
  s.bad = guard:judge_loss(s.loss)
  if s.bad then   -- the update is skipped before any work on the grads
    s.skipped, s.grad_norm = true, 0 / 0
    ctx:skip()
  else
    local lr = s.lr
    s.skipped, s.grad_norm = step.update(ctx, opt.params,
      function() env.ddp:optimizer_step(opt, lr) end,
      function() return clip(env, env.cfg.train.max_grad_norm) end, mesh.world, opt)
    -- Non-finite grads outside fp16 (where overflows are the scaler's routine).
    if s.skipped and guard.enabled and not ctx.scaler then s.bad = "nonfinite_grad" end
  end
  s.opt1 = timer:mark()
  timer:wait(s.opt1)   -- CUDA: the update may still run (a second wait in this step)
end

-- The end of a step, eager or replayed (s: what the step measured and decided): the
-- guard's verdict agreed over the ranks, the grads and the tape dropped, the record.
local function finish_step(env, s)
  local t, guard, mem, dev = env.cfg.train, env.guard, env.mem, env.device
  local n = s.step
  local bad = guard.enabled and agree(env, s.bad) or nil
  local roll_back = guard:finish(n, s.pos, s.loss, bad)
  C.tt_alloc_stats_get(dev, mem)
  local peak = tonumber(mem.peak_bytes)
  env.model:zero_grad()
  C.tt_tape_clear()   -- drops any recorded branch no backward reached
  if trace.on then trace.span("optimizer", s.ow0, metrics.now(), { step = n }) end
  env.step_count = n
  local tokens = t.batch_size * env.seq_len
  env.tokens_seen = env.tokens_seen + tokens
  local t0, data_wait = s.t0, s.data_wait
  local dt = metrics.now() - t0
  local exposed = C.tt_dist_wait_seconds() - s.wait0
  local r = { step = n, loss = s.loss, lr = s.lr,
              grad_norm = s.grad_norm, tokens = env.tokens_seen, tokens_per_s = tokens / dt,
              step_time_s = dt, data_wait_s = data_wait,
              exposed_comm_s = exposed, forward_s = s.forward, backward_s = s.fb - s.forward,
              optimizer_s = s.optimizer_s, graph_s = s.graph_s,
              other_s = dt - data_wait - s.fb - exposed - s.optimizer_s - (s.graph_s or 0),
              live_bytes = tonumber(mem.live_bytes), cached_bytes = tonumber(mem.cached_bytes),
              param_bytes = env.memory.params, grad_bytes = env.memory.grads,
              optimizer_bytes = env.memory.optimizer,
              host_optimizer_bytes = env.memory.host_optimizer,
              host_master_bytes = env.memory.host_masters,
              released_master_bytes = env.memory.released_masters, peak_bytes = peak,
              step_peak_bytes = peak - s.live0,
              loss_scale = env.amp:scale(), skipped = s.skipped, restarts = env.restarts,
              guard = bad, data_position = s.pos, roll_back = roll_back or nil }
  if env.ddp.zero_stage == 3 then   -- ZeRO-3: the parameter all-gathers this step issued
    local gathers, bytes = env.ddp:unit_gathers()
    r.param_gathers = gathers - (env.param_gathers_seen or 0)
    r.param_gather_bytes = bytes - (env.param_gather_bytes_seen or 0)
    env.param_gathers_seen, env.param_gather_bytes_seen = gathers, bytes
  end
  if env.data.stats then   -- tetra.data's loader reports its own throughput and queue
    local st = env.data:stats()
    r.loader_tokens_per_s, r.loader_queue_depth = st.tokens_per_s, st.queue_depth
  end
  if env.peak_tflops and env.peak_tflops > 0 then
    r.mfu = env.flops_per_token * tokens / dt / (env.peak_tflops * 1e12 * (env.mesh.size or 1))
  end
  telemetry.step(r)
  if trace.on then trace.span("step " .. n, t0, t0 + dt, { loss = r.loss }) end
  return r
end

-- A step of the captured graph (train.cuda_graphs, after the warm-up): the batch is in
-- the static input `global`; the first such step captures, every one replays. The
-- learning rate and bias corrections go into the optimizer's stats (AdamW:set_update)
-- before the replay.
local function graph_step(env, s, global)
  local graphs, strategy, ctx, guard = env.graphs, env.strategy, env.amp, env.guard
  local opt, lr = env.optimizer, env.schedule(s.step)
  local timer = strategy.timer
  opt.external_update = true
  opt:set_update(lr)
  if not graphs.graph then
    local g = graph.new(env.device, { check = graphs.check, readers = { opt },
                                      host_once = { { ctx, "before_update" },
                                                    { ctx, "after_update" } } })
    -- No timing marks inside: the graph is timed as a whole.
    local ok, err = pcall(g.capture, g, function()
      local timed = strategy.timer
      strategy.timer = env.null_timer
      local done, why = pcall(function()
        launch_update(env, forward_backward(env, global, env.accum), lr)
      end)
      strategy.timer = timed
      if not done then error(why, 0) end
    end)
    if not ok then
      g:close()
      user_error(string.format("train.cuda_graphs: capturing step %d failed: %s (set " ..
                               "train.cuda_graphs=false to train without graphs)", s.step,
                               tostring(type(err) == "table" and err.message or err)))
    end
    graphs.graph = g
  end
  s.ow0 = metrics.now()
  local g0 = timer:mark()
  -- The replay's update runs no Lua: the weights' versions move here, as after_update
  -- moves them in an eager step, so that a read outside the graph (an eval, a sample)
  -- casts their fp16 copies again (the graph's own forward casts every replay).
  local marks = ctx:before_update(opt)
  graphs.graph:replay()
  ctx:after_update(marks)
  local g1 = timer:mark()
  s.lr = lr
  s.skipped, s.grad_norm, s.loss = step.update_finish(ctx, opt)
  s.bad = guard:judge_loss(s.loss, opt.last_stats.spike)
  if s.skipped and not s.bad and guard.enabled and not ctx.scaler then s.bad = "nonfinite_grad" end
  s.fb, s.forward, s.optimizer_s, s.graph_s = 0, 0, 0, timer:seconds(g0, g1)
  return finish_step(env, s)
end

-- -- The step ---------------------------------------------------------------------------

-- One optimizer step of env (env.step()); returns its metrics record.
function step.run(env)
  local t, data, guard, strategy = env.cfg.train, env.data, env.guard, env.strategy
  local n = env.step_count + 1
  trace.begin_step(n)
  -- s: what this step measures and decides, for finish_step's record
  local s = { step = n, t0 = metrics.now(), wait0 = C.tt_dist_wait_seconds() }
  C.tt_alloc_stats_get(env.device, env.mem)
  s.live0 = tonumber(env.mem.live_bytes)
  C.tt_alloc_reset_peak(env.device)
  env.ddp:begin_step()

  -- The global batch at this step's data position (past any window the guard skipped;
  -- a loader that reads in order drops the skipped batches). A tetra.data source counts
  -- its training batches once its loader exists.
  s.pos = guard:position(n)
  local function next_read() return data.next_step and (data.next_step.train or 1) end
  while next_read() and next_read() < s.pos do
    free(data:batch(next_read(), t.batch_size, env.seq_len, "train"))
  end
  write_step_inputs(env)
  -- (eager steps of this process, not the step number: a resumed run's first steps make
  -- the handles, workspaces and plans a capture may not make)
  local graphed = env.graphs and env.graphs.eager >= env.graphs.warmup
  if env.graphs and not graphed then env.graphs.eager = env.graphs.eager + 1 end
  local mine = upload_batch(env, s.pos, graphed)   -- this rank's rows
  s.data_wait = metrics.now() - s.t0
  if trace.on then trace.span("data_wait", s.t0, s.t0 + s.data_wait, { step = n }) end
  local timer = strategy.timer
  timer:reset()
  if graphed then return graph_step(env, s, mine) end

  -- Offload under bf16 / fp16: the weights' f32 masters leave the device until the
  -- update (AdamW:release_masters); they are whole again after it, and after an error
  -- (under ZeRO-1 and 2, which cannot gather then, before anything reads them next:
  -- AdamW:settle_masters).
  local opt = env.optimizer
  local fb0, fb1, opt0
  -- log.op_profile_step: this step op by op, with regions for the work that records none
  -- (unless a profile already runs: the REPL's profile_step(), whose regions these are)
  local profiled = env.op_profile_step == n and not ops.running()
  local region = ops.region
  if profiled then ops.start(env.device) end
  local ok, err = pcall(function()
    -- The last update, overlapped: the weights outside the blocks land now, each
    -- block's in its forward (AdamW:overlap_with).
    if opt.arrive then opt:arrive(0) end
    if opt.release_masters then opt:release_masters() end
    region("step start (weights landing, masters away)")
    -- Forward and backward of this rank's rows.
    fb0 = timer:mark()
    local loss_sum = forward_backward(env, mine, env.accum)   -- a device tensor, or a number
    free(mine)
    region("after the last backward (gradient reduction)")
    fb1 = timer:mark()
    if guard:poisoned(s.pos) then loss_sum = poison(env, loss_sum) end
    -- The grads are complete (after the data-parallel averaging, before unscaling and
    -- clipping): tests inject overflows here.
    if env.on_grads then env.on_grads(env, n) end

    -- The update: unscale, clip, the optimizer, the guard's verdict.
    opt0 = timer:mark()
    s.ow0 = metrics.now()
    s.lr = env.schedule(n)
    if type(loss_sum) ~= "number" and opt.read_stats then
      update_one_read(env, s, loss_sum)
    else
      update_host(env, s, loss_sum)
    end
    region("optimizer update")
  end)
  -- The update goes on landing in the next step's forward only when the caller says
  -- that step comes next (env.overlap_next, tetra.train.loop); else, and after an
  -- error, every weight is whole on the device before the step returns (see above for
  -- ZeRO after an error).
  -- (finish_update settles the masters itself; an update still landing, only them.)
  local settle = nil
  if opt.finish_update and (not ok or not env.overlap_next) then settle = opt.finish_update
  elseif opt.settle_masters then settle = opt.settle_masters end
  if settle then
    local sok, serr = pcall(settle, opt, not ok)
    if ok and not sok then ok, err = false, serr end
  end
  if profiled then
    local pok, prof = pcall(ops.stop)
    if ok and not pok then ok, err = false, prof end
    if ok and env.rank == 0 then
      print(string.format("op profile of step %d on rank 0 (%s; each interval between two " ..
                          "marks charged to the later one):", n,
                          env.device == C.TT_CPU and "the host clock" or "CUDA events"))
      print(ops.format(prof, env.cfg.log.op_profile_top))
    end
    env.op_profile = ok and prof or nil
  end
  if not ok then error(err, 0) end
  -- compute times, between marks the device has passed (the read waited for them)
  s.fb = timer:seconds(fb0, fb1)
  s.forward = strategy:forward_seconds()
  s.optimizer_s = timer:seconds(opt0, s.opt1)
  return finish_step(env, s)
end

-- Mean loss over n_batches held-out global batches (default train.eval_steps), no tape.
-- Mock data give the same batches at every evaluation; a tetra.data source reads on
-- through its evaluation split.
function step.evaluate(env, n_batches)
  local t = env.cfg.train
  n_batches = n_batches or t.eval_steps or 4
  -- ZeRO with the masters on the host: weights a failed step left in pieces gathered
  if env.optimizer.whole_masters then env.optimizer:whole_masters() end
  return F.no_grad(function()
    local sum = 0.0
    for i = 1, n_batches do
      local mine = to_dev(rows_of(env, env.data:batch(i, t.batch_size, env.seq_len, "val")),
                          env.device)
      sum = sum + env.strategy:eval_loss(mine)
      free(mine)
    end
    return env.mesh.dpcp:mean(sum / n_batches)
  end)
end

return step
