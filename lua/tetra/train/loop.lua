-- tetra.train.loop: the training loop around env.step (tetra.train.step): progress,
-- metrics records, evaluation, samples, checkpoints and the loss guard's roll-back.
local checkpoint = require("tetra.checkpoint")
local metrics = require("tetra.obs.metrics")
local telemetry = require("tetra.obs.telemetry")
local straggler = require("tetra.obs.straggler")
local trace = require("tetra.obs.trace")
local generate = require("tetra.train.generate")
local user_error = require("tetra.util.errors").raise
local host = require("tetra.host")
local C = require("tetra.ffi").C

local loop = {}

-- SIGUSR1 (a scheduler's notice before preemption or a time limit; mpirun passes it on
-- to every rank) asks the run to save a checkpoint and stop. Each rank reads its flag at
-- the step boundary and the world agrees on it (a max), so every rank stops after the
-- same step. tetra run then exits with this status.
loop.STOPPED_EXIT = 3
local stop_flag
local function stop_agreed(env)
  local mine = host.stop_requested(true) and 1 or 0
  local w = env.mesh.world
  if not w or w.size <= 1 then return mine == 1 end
  stop_flag = stop_flag or require("tetra.tensor").from_table({ 0 })
  C.tt_tensor_set(stop_flag, 0, mine)
  w:all_reduce(stop_flag, "max")
  return C.tt_tensor_get(stop_flag, 0) ~= 0
end

-- Runs cfg.train.steps optimizer steps. Rank 0 shows progress (log.progress): one
-- updating line on a terminal (not under mpirun), otherwise a plain line every log.every
-- steps; every step goes to log.metrics_file. Eval loss every train.eval_every steps and
-- at the end; a text sample every train.sample_every steps and at the end (when the data
-- has a tokenizer); a closing summary line (steps, time, tokens/s, loss, eval loss,
-- checkpoint). Returns { first_loss, last_loss, eval_loss, records (step, loss,
-- eval_loss, step_time_s, skipped of the last train.records_kept steps), elapsed_s }.
loop.records_kept = 1000

-- log.log_file: every rank appends its own progress lines (a line per step, plain text)
-- to this path, with "{rank}" replaced by the rank; without the placeholder a multi-rank
-- run adds ".rank<N>" so ranks never share a file.
local function open_rank_log(path, rank, size)
  if not path or path == "" then return nil end
  if path:find("{rank}", 1, true) then
    path = path:gsub("{rank}", tostring(rank))
  elseif size > 1 then
    path = path .. ".rank" .. rank
  end
  return metrics.lines(metrics.open_file(path, "a", "log.log_file"), path, "log.log_file")
end

-- train.max_bad_steps bad steps in a row (tetra.train.guard): loads the latest checkpoint
-- into env (an in-process resume) and skips the data the bad steps read, so that the
-- run goes on past it. Every rank reaches this together (the guard's verdict is agreed).
function loop.roll_back(env, show)
  local guard, cfg = env.guard, env.cfg
  -- An offloaded update still landing (offload's overlap) lands before the load.
  if env.optimizer.finish_update then env.optimizer:finish_update() end
  local first, last = guard:bad_run()
  local ck = cfg.checkpoint or {}
  local path = ck.dir and ck.dir ~= "" and
               checkpoint.resume_path({ checkpoint = { dir = ck.dir, resume = "auto" } })
  if not path then
    user_error(string.format("train.max_bad_steps: %d bad steps in a row (steps %d-%d) and " ..
      "no checkpoint to roll back to: set checkpoint.dir and checkpoint.every",
      last.step - first.step + 1, first.step, last.step))
  end
  checkpoint.load(env, path)
  -- A second run of bad steps from the same step after the same checkpoint means the
  -- skip did not help: going round again would never end.
  local again = env.rolled_back and env.rolled_back.resumed == env.step_count and
                env.rolled_back.first == first.step
  if again then
    user_error(string.format("train.max_bad_steps: steps %d-%d went bad again after rolling " ..
      "back to %s and skipping their data: stopping (lower train.lr, or check the data " ..
      "and train.spike_zscore)", first.step, last.step, path))
  end
  env.rolled_back = { resumed = env.step_count, first = first.step }
  local from, pos = guard:skip_to_after(env.step_count, first, last)
  if show then
    local b = cfg.train.batch_size
    io.stdout:write(string.format("ROLLED BACK: %d bad steps in a row (steps %d-%d): resumed " ..
      "from %s at step %d; skipping data positions %d-%d (samples %d-%d of the global " ..
      "stream), step %d reads position %d\n", last.step - first.step + 1, first.step,
      last.step, path, env.step_count, pos, last.position, (pos - 1) * b,
      last.position * b - 1, from, last.position + 1))
    io.stdout:flush()
  end
end

function loop.run(env)
  local cfg = env.cfg
  local t, log = cfg.train, cfg.log or {}
  local total = t.steps
  local is_main = env.rank == 0
  local rank_log = open_rank_log(log.log_file, env.rank, env.mesh.size or 1)
  -- A resumed run keeps the records up to its checkpoint (read before the file reopens).
  local earlier = is_main and env.resumed_from and
                  checkpoint.metrics_before(log.metrics_file, env.step_count) or {}
  local writer = metrics.open(is_main and log.metrics_file or nil)
  for _, r in ipairs(earlier) do writer:write(r) end
  local show = is_main and log.progress ~= false
  -- Redraw one line only on a terminal of our own: under mpirun stdout is a pseudo-
  -- terminal Open MPI forwards, often into a file.
  local tty = show and metrics.stdout_is_terminal() and not require("tetra.dist").launched()
  local every = log.every or 1
  local eval_every, sample_every = t.eval_every or 0, t.sample_every or 0
  local records, started = {}, metrics.now()
  local summary = { steps = 0, tokens = 0, time_s = 0.0 }
  local avg_step
  if show and env.resumed_from then
    if env.step_count >= total then
      io.stdout:write(string.format("resumed from %s at step %d: train.steps is %d, " ..
                                    "nothing left to train (raise train.steps to go on)\n",
                                    env.resumed_from, env.step_count, total))
    else
      io.stdout:write(string.format("resumed from %s at step %d; continuing at step %d of %d\n",
                                    env.resumed_from, env.step_count, env.step_count + 1,
                                    total))
    end
    if log.op_profile_step and log.op_profile_step <= env.step_count then
      io.stdout:write(string.format("log.op_profile_step = %d: the run resumed after it " ..
                                    "(at step %d), so no step is profiled; choose a later " ..
                                    "step\n", log.op_profile_step, env.step_count))
    end
    io.stdout:flush()
  end
  -- tetra launch reads the last completed step from this file (rank 0 writes it). Written
  -- whole, then renamed over the last: a rank killed while writing (the job aborted by
  -- another rank's failure) leaves the previous step, not an empty file that reads as
  -- "before its first step" and makes a deterministic failure look like a new one.
  local status_path = is_main and os.getenv("TETRA_LAUNCH_STATUS")
  local function report_step(step)
    if not status_path or status_path == "" then return end
    local tmp = status_path .. ".tmp"
    local f = io.open(tmp, "w")
    if f then
      f:write("step ", step, "\n")
      f:close()
      os.rename(tmp, status_path)
    end
  end
  report_step(env.step_count)
  local crash_at = t.inject_crash_step or 0
  -- checkpoint.async: saves are written by a thread while the next steps run (the last
  -- one is written before the run returns).
  local async_save = (cfg.checkpoint or {}).async == true
  local checkpoint_s = 0   -- the loop's time on checkpoints since the previous record
  local stragglers = straggler.new(cfg, env.mesh)   -- nil: one rank, or nothing reads it
  host.catch_stop_signal()
  local stopped
  while env.step_count < total do
    local step = env.step_count + 1
    if crash_at > 0 and step == crash_at then
      user_error(string.format("train.inject_crash_step: failing at step %d on purpose " ..
                               "(a test switch; unset it to train)", step))
    end
    -- Offload's update may land in the next step's forward only when nothing reads the
    -- weights in between (evaluation, a checkpoint, a sample, the end).
    env.overlap_next = step < total and
      not (eval_every > 0 and step % eval_every == 0) and
      not checkpoint.due(cfg, step, total) and
      not (sample_every > 0 and step % sample_every == 0)
    local r = env.step()
    env.overlap_next = nil
    -- Reported at once: the other ranks are past this step's collectives now, and one
    -- that fails at the next step aborts the job, this rank too, soon after.
    report_step(step)
    if stragglers then stragglers:observe(r) end
    r.checkpoint_s = checkpoint_s
    checkpoint_s = 0
    -- The first steps pay for warm-up (allocator, page faults): a moving average of the
    -- step time gives a steadier ETA.
    avg_step = avg_step and (0.9 * avg_step + 0.1 * r.step_time_s) or r.step_time_s
    if eval_every > 0 and (step % eval_every == 0 or step == total) then
      r.eval_loss = env.evaluate()
    end
    trace.end_step(step, total)
    writer:write(r)
    -- The most recent train.records_kept steps: memory stays flat on runs of any length.
    if #records >= loop.records_kept then table.remove(records, 1) end
    records[#records + 1] = { step = r.step, loss = r.loss, eval_loss = r.eval_loss,
                              step_time_s = r.step_time_s, skipped = r.skipped }
    summary.first_loss = summary.first_loss or r.loss
    summary.steps, summary.tokens = summary.steps + 1, summary.tokens + t.batch_size * cfg.model.seq_len
    summary.time_s = summary.time_s + r.step_time_s
    if r.eval_loss then
      summary.eval_loss = r.eval_loss
      summary.best_eval = math.min(summary.best_eval or math.huge, r.eval_loss)
    end
    local line
    if show or rank_log then
      line = metrics.progress_line(r, total, avg_step * (total - step))
      if r.skipped then   -- kept on its own line on a terminal too
        local why = { nonfinite_loss = "NaN/Inf loss", spike = "loss spike" }
        line = line .. " | SKIPPED: " .. (why[r.guard] or "inf/NaN grads") ..
               (env.amp.scaler and string.format(", loss scale now %g", r.loss_scale) or "")
      end
    end
    if rank_log then
      rank_log:put(os.date("!%Y-%m-%dT%H:%M:%SZ "), "rank ", env.rank, " | ", line, "\n")
    end
    if show then
      if tty then
        io.stdout:write("\r\27[K", line,
                        (step == total or r.eval_loss or r.skipped) and "\n" or "")
        io.stdout:flush()
      elseif step == 1 or step % every == 0 or step == total or r.eval_loss or r.skipped then
        io.stdout:write(line, "\n")
        io.stdout:flush()
      end
    end
    -- The record is on disk before the save: a run killed during the save resumes from an
    -- earlier checkpoint and keeps that checkpoint's records, so no step's record is
    -- lost. The save's time goes in the next record (checkpoint_s). A step that rolls
    -- back saves nothing.
    local due = false
    if r.roll_back then
      checkpoint.drain(env)
      loop.roll_back(env, show)
    else
      local c0 = metrics.now()
      due = checkpoint.due(cfg, step, total)
      if due and async_save and step ~= total then
        checkpoint.save_async(env)   -- the copy to host memory; the writing overlaps
      elseif due then
        summary.checkpoint = checkpoint.save(env)
      elseif async_save then
        checkpoint.poll(env)
      end
      checkpoint_s = metrics.now() - c0
      if due then
        telemetry.checkpoint(checkpoint_s)
        if trace.on then trace.span("checkpoint", c0, c0 + checkpoint_s, { step = step }) end
      end
    end
    -- (After the last step there is nothing left to stop: the run ends as usual.)
    if step < total and stop_agreed(env) then
      -- This step's save (an asynchronous one is published now), or one made now; after
      -- a roll-back the state is the latest checkpoint's already.
      local published = checkpoint.drain(env)
      local ck = cfg.checkpoint or {}
      if due then
        summary.checkpoint = summary.checkpoint or published
      elseif not r.roll_back and ck.dir and ck.dir ~= "" then
        summary.checkpoint = checkpoint.save(env)
      end
      stopped = { signal = "SIGUSR1", step = env.step_count }
      break
    end
    if sample_every > 0 and step % sample_every == 0 and step ~= total then
      generate.print_sample(env)
    end
  end
  writer:close()
  if stopped and is_main then
    local ck = cfg.checkpoint or {}
    io.stdout:write(string.format("stopped by %s after step %d: %s\n", stopped.signal,
      stopped.step, summary.checkpoint and ("checkpoint " .. summary.checkpoint ..
        "; continue with --set checkpoint.resume=auto")
      or (ck.dir and ck.dir ~= "" and "the latest checkpoint in " .. ck.dir .. " holds it")
      or "no checkpoint.dir, so nothing was saved"))
    io.stdout:flush()
  end
  if not stopped then generate.print_sample(env) end
  local last = records[#records]
  if summary.steps > 0 and (show or rank_log) then
    local line = string.format("done: %d steps in %.2f s, %.0f tokens/s, loss %.4f -> %.4f",
      summary.steps, metrics.now() - started, summary.tokens / summary.time_s,
      summary.first_loss, last.loss)
    if summary.eval_loss then
      line = line .. string.format(", eval loss %.4f (best %.4f)", summary.eval_loss,
                                   summary.best_eval)
    end
    if summary.checkpoint then line = line .. ", checkpoint " .. summary.checkpoint end
    if show then
      io.stdout:write(line, "\n")
      io.stdout:flush()
    end
    if rank_log then
      rank_log:put(os.date("!%Y-%m-%dT%H:%M:%SZ "), "rank ", env.rank, " | ", line, "\n")
    end
  end
  if rank_log then rank_log:close() end
  return { first_loss = summary.first_loss, last_loss = last and last.loss,
           eval_loss = last and last.eval_loss, records = records,
           elapsed_s = metrics.now() - started, stopped = stopped }
end

return loop
