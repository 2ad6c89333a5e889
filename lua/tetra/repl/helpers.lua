-- tetra.repl.helpers: the functions a session puts in scope for a look inside a model:
-- help(), inspect(x), probe(), train_steps(n), profile_step(rows), sample(prompt, n),
-- interrupted(), full(t).
local show = require("tetra.repl.show")
local session = require("tetra.repl.session")

local M = {}

-- The placement of `t` when it is a parameter of the session's parallel model.
local function find_placement(env, t)
  local par = rawget(env, "par")
  if not (show.is_tensor(t) and type(par) == "table" and par.placements) then return nil end
  local T = require("tetra.tensor")
  local key = T.key(t)
  for _, e in ipairs(par:placements()) do
    if T.key(e.tensor) == key then return e.placement end
  end
end

-- The session's step() (unwrapped where the REPL wraps it), or an error naming the helper
-- at its caller's line.
local function session_step(env, helper)
  local step = session.raw_steps[env] or env.step
  if not step then
    error(helper .. "() needs step() in scope (start with tetra -i RECIPE)", 3)
  end
  return step
end

-- v (default when nil) if a positive whole number, else an error at the caller's line.
local function positive_whole(v, default, what)
  if v == nil then v = default end
  if type(v) ~= "number" or v < 1 or v % 1 ~= 0 then
    error(what .. " must be a positive whole number, got " .. tostring(v), 3)
  end
  return v
end

-- The helpers of help() in env.
function M.add(env)
  local activations = setmetatable({}, { __mode = "k" })
  show.set_placements(function(t) return find_placement(env, t) end)

  function env.help()
    print([[
inspect(x)       a tensor's statistics, or a module's parameters (norm, grad norm) and,
                 after probe(), its output activation
probe()          one forward + backward on a training batch; records every module's
                 output and leaves the gradients in place
train_steps(n)   run n optimizer steps (default 1) and print loss, lr, tokens/s;
                 Ctrl-C stops it between two steps
profile_step(k)  one optimizer step under the op profile: its k longest ops (default
                 25), forward and backward apart, and the optimizer's update
sample(p, n)     a continuation of the text p by n tokens (default: train.prompt and
                 train.sample_tokens), drawn as the run's samples are (train.temperature,
                 top_k, seed); every rank of a tensor- or pipeline-parallel model runs it
full(t)          the whole parameter of which t is a tensor-parallel shard (every
                 rank of t's tp group must run it)
interrupted()    whether Ctrl-C was pressed, for loops of your own (under mpirun
                 agreed by the ranks running the line: all of them must call it)
relayout{tp = 2, pp = 2}   the model and optimizer state re-sharded into a new layout
                 of the same ranks (every rank runs it); training goes on from there
%on 1,3 | %on tp=0 | %on all    (under mpirun) the ranks the next lines run on
model, optimizer, data, cfg, step()   set up by `tetra -i FILE` when FILE is a recipe
exit()           leave (or Ctrl-D)]])
  end

  function env.inspect(x)
    if show.is_tensor(x) then
      local head = show.shard_header(x)
      if head then print(head) end
      print(show.stats_line(show.tensor_stats(x)))
      local g = x.grad
      if g then print("grad " .. show.stats_line(show.tensor_stats(g))) end
      return
    end
    if type(x) == "table" and x.named_parameters then
      local name = show.module_name(env.model, x)
      print((name and name ~= "" and (name .. ": ") or "") .. tostring(x))
      local act = activations[x]
      if act then print("  output   " .. show.stats_line(act)) end
      for _, np in ipairs(x:named_parameters()) do
        local st = show.tensor_stats(np[2])
        local g = np[2].grad
        print(("  %-28s %-16s norm %.4g  grad norm %s"):format(np[1], show.shape_str(st.shape), st.norm,
          g and ("%.4g"):format(show.tensor_stats(g).norm) or "-"))
      end
      return
    end
    print(show.pretty(x))
  end

  function env.probe()
    local model, data, cfg = env.model, env.data, env.cfg
    if not (model and data and cfg) then
      error("probe() needs model, data and cfg in scope (start with tetra -i RECIPE)", 2)
    end
    local tetra = require("tetra")
    local handles = {}
    for _, nm in ipairs(model:named_modules()) do
      local mod = nm[2]
      handles[#handles + 1] = mod:register_forward_hook(function(_, out)
        if show.is_tensor(out) then activations[mod] = show.tensor_stats(out) end
      end)
    end
    model:zero_grad()
    local ok, err = pcall(function()
      if env.par and env.ddp then
        -- A recipe's parallel model: its own step strategy runs forward and backward
        -- on this rank's part of one global batch (every rank must run probe()).
        local T = require("tetra.tensor")
        local strategy = require("tetra.parallel.step").new(env.par, env.ddp, env.amp, cfg)
        local global = T.moved(data:batch(1, cfg.train.batch_size, cfg.model.seq_len, "train"),
                               env.device)
        local mine = data.local_rows and global or env.ddp:batch_slice(global)
        env.ddp:begin_step()
        local sum = strategy:forward_backward(mine, 1)   -- a one-value tensor, or a number
        if type(sum) ~= "number" then sum = sum:item() end
        local value = env.mesh.dpcp:mean(sum)
        print(("loss %.4f on %d x %d tokens; gradients kept, activations recorded"):format(
          value, cfg.train.batch_size, cfg.model.seq_len))
        return
      end
      local micro = cfg.train.micro_batch_size or cfg.train.batch_size
      local batch = data:batch(1, micro, cfg.model.seq_len, "train")
      local loss = tetra.train.loss(model, batch)
      local value = loss:item()
      loss:backward()
      print(("loss %.4f on %d x %d tokens; gradients kept, activations recorded"):format(
        value, micro, cfg.model.seq_len))
    end)
    for _, h in ipairs(handles) do h.remove() end
    if not ok then error(err, 0) end
  end

  function env.train_steps(n)
    local step = session_step(env, "train_steps")
    n = positive_whole(n, 1, "train_steps(n): n")
    -- The whole loop runs with Ctrl-C only recorded: it is honoured between two steps.
    session.uninterrupted(function()
      -- probe() leaves gradients behind; a step must start from zero.
      if env.model and env.model.zero_grad then env.model:zero_grad() end
      for i = 1, n do
        local r = step()
        if type(r) == "table" then
          -- Under mpirun the speed differs per rank; loss, lr and norm are global, so the
          -- ranks' lines group into one.
          local speed = session.spmd and "" or ("  %.0f tok/s"):format(r.tokens_per_s or 0)
          print(("step %d  loss %.4f  lr %.3g  grad norm %.3g%s"):format(
            r.step or 0, r.loss or 0, r.lr or 0, r.grad_norm or 0, speed))
        end
        -- Under mpirun the lines come back when the command ends; meanwhile rank 0's
        -- terminal shows its latest step on one line that the answers replace.
        if session.live_status and type(r) == "table" then
          session.live_status(("[0] step %d  loss %.4f  (%d of %d; Ctrl-C stops)"):format(
            r.step or 0, r.loss or 0, i, n))
        end
        if i < n and session.interrupt_requested() then
          print(("interrupted (Ctrl-C) after %d of %d steps"):format(i, n))
          return
        end
      end
    end)
  end

  -- One step under the op profile (tetra.obs.ops): where its time went, printed. The
  -- step's regions (the optimizer's update ...) are marked by the step itself.
  function env.profile_step(rows)
    local step = session_step(env, "profile_step")
    rows = positive_whole(rows, 25, "profile_step(k): k")
    local cfg = rawget(env, "cfg")
    local device = (cfg and cfg.train and cfg.train.device) or "cpu"
    if cfg and cfg.train and cfg.train.cuda_graphs then
      -- (as log.op_profile_step is refused with it: a replayed step records no ops, and
      -- the capture step cannot record timing events)
      error("profile_step(): this session's steps run as a CUDA graph (train.cuda_graphs), " ..
            "which records no ops to time; start the session with --set " ..
            "train.cuda_graphs=false to profile", 2)
    end
    local ops = require("tetra.obs.ops")
    session.uninterrupted(function()
      if env.model and env.model.zero_grad then env.model:zero_grad() end
      local r
      local prof = ops.profile(require("tetra.train").device(device), function() r = step() end)
      if type(r) == "table" then
        print(("step %d  loss %.4f; its time op by op (%s):"):format(r.step or 0, r.loss or 0,
          device == "cpu" and "the host clock" or "CUDA events"))
      end
      print(ops.format(prof, rows))
    end)
  end

  -- A continuation of `prompt`, printed: what a run's samples print (train.print_sample),
  -- for any prompt and length. The generation is collective under tensor and pipeline
  -- parallelism, so Ctrl-C waits for its end.
  function env.sample(prompt, n)
    local run = rawget(env, "env")   -- the recipe's training environment
    if not (run and run.generate) then
      error("sample() needs a recipe's model (start with tetra -i RECIPE)", 2)
    end
    if not run.tokenizer then
      error("sample(): this run reads no text, so it has no tokenizer (data.mock=true); " ..
            "generate(ids, {max_new_tokens = n}) continues token ids", 2)
    end
    local t = run.cfg.train
    if prompt == nil then prompt = t.prompt or "\n" end
    if type(prompt) ~= "string" then
      error("sample(prompt, n): prompt must be a string, got " .. type(prompt), 2)
    end
    n = positive_whole(n, (t.sample_tokens or 0) > 0 and t.sample_tokens or 64,
                       "sample(prompt, n): n")
    session.uninterrupted(function()
      print(prompt .. require("tetra.train.generate").continuation(run, prompt, n))
    end)
  end

  -- For a loop of one's own: `while not interrupted() do ... end`. Under mpirun every
  -- rank running the line must call it alike (the answer is agreed between them).
  function env.interrupted() return session.interrupt_requested() end

  function env.full(t)
    if not show.is_tensor(t) then error("full(t): t must be a tensor", 2) end
    local pl = find_placement(env, t)
    if not (pl and pl.split) then return t end
    local T = require("tetra.tensor")
    return T.no_grad(function()
      -- Each tp rank writes its rows into zeros; the sum over the group is the whole.
      local whole = T.zeros(pl.shape, { dtype = t.dtype })
      whole:narrow(pl.dim, pl.offset, pl.length):copy_(t)
      return env.mesh.tp:all_reduce(whole, "sum")
    end)
  end
end

return M
