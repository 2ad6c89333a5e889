-- tetra profile RECIPE [--set key=value]... [--reps N] [--ops [N]] [--measure-steps N]
--               [--measure-rounds R] [--no-measure] [--launcher CMD]
--
-- The layer profiler: builds the configured model whole on train.device and times the
-- forward and the backward of each part a pipeline stage can hold (the embedding, every
-- block, the head with its loss) on one micro-batch (train.batch_size / data parallel
-- size / train.gradient_accumulation_steps rows of model.seq_len tokens), the parts run
-- in one chain as a pipeline would run them (time_chain), the median of --reps runs
-- (default 5), and the activation memory each part's forward leaves for its backward
-- (what the allocator holds after it, less what it held before: the output and every
-- saved tensor). From these it proposes the split of the blocks over
-- parallel.pipeline_parallel_size stages (the embedding on the first stage, the head on
-- the last) whose step, replayed with the engine's own schedule (M.predict), is
-- shortest, prints it as parallel.pipeline_stages, and the step both splits predict.
-- Then it measures both: it trains --measure-steps steps (default 8) with each split
-- under `LAUNCHER -np WORLD tetra run ...` (default launcher: mpirun), the splits taking
-- turns --measure-rounds times (default 2), and compares the median step times, each
-- run's first step left out, pooled and round by round.
-- With --ops [N] it also runs the micro-batch once more, forward and backward of the
-- whole model, under the engine's op profile (tetra.obs.ops) and prints the N ops
-- (default 25) that took longest, by phase, after the parts.
-- Exit 2 with one line on bad usage; config errors as `tetra run` gives them.
local ffi = require("ffi")
local config = require("tetra.config")
local metrics = require("tetra.obs.metrics")
local T = require("tetra.tensor")
local F = require("tetra.nn.functional")
local tffi = require("tetra.ffi")
local train = require("tetra.train")
local plan_model = require("tetra.planner")
local errors = require("tetra.util.errors")
local layout = require("tetra.parallel.layout")
local ops = require("tetra.obs.ops")

local C = ffi.C
local free = F.free
local M = {}

local USAGE = "usage: tetra profile RECIPE [--set key=value]... [--reps N] [--ops [N]] " ..
              "[--measure-steps N] [--measure-rounds R] [--no-measure] [--launcher CMD]"

local usage_error = errors.usage("tetra profile")

local median = require("tetra.obs.metrics").median

-- -- Timing the parts ------------------------------------------------------------------

-- One micro-batch through the whole model as a pipeline of one part per stage would run
-- it: the parts' forwards back to back, each on the one before's output (cut from the
-- tape: a leaf that requires grad, so each backward stops there), then the backwards from
-- the loss down, each from the gradient the one after left on its input. So every part
-- runs on real activations with the whole micro-batch's tape alive, the caches as full
-- as in training. Returns each part's forward seconds, backward seconds and activation
-- bytes (what the allocator holds after its forward, less before: its output and every
-- tensor its ops saved).
local function time_chain(dev, clock, ids, targets, parts)
  local n = #parts
  local fwd, bwd, act = {}, {}, {}
  local inputs, outputs = {}, {}
  local x = nil
  for i = 1, n do
    local live0 = T.memory_stats(dev).live_bytes
    local t0 = clock()
    local y = parts[i](x, ids, targets)
    fwd[i] = clock() - t0
    act[i] = T.memory_stats(dev).live_bytes - live0
    inputs[i], outputs[i] = x, y
    if i < n then
      x = y:detach()
      tffi.check(C.tt_set_requires_grad(x, 1))
    end
  end
  for i = n, 1, -1 do
    local g = i < n and inputs[i + 1].grad or nil
    local t0 = clock()
    if g then F.backward_with(outputs[i], g) else F.backward(outputs[i]) end
    bwd[i] = clock() - t0
    if g then free(g) end
    free(outputs[i])
    if inputs[i + 1] then free(inputs[i + 1]) end
  end
  return fwd, bwd, act
end

-- The profile of cfg's model: { parts = { { name, forward_s, backward_s, act_bytes } ...
-- } (embedding, block 0 .. L-1, head), micro_rows, seq_len, ops }; with_ops: ops is the
-- op profile (tetra.obs.ops) of one more micro-batch through the whole model.
function M.profile(recipe, cfg, reps, with_ops)
  local dev = train.device(cfg.train.device)
  local t = cfg.train
  if t.threads and t.threads > 0 then C.tt_set_num_threads(t.threads) end
  C.tt_manual_seed(t.seed or 0)
  local model = recipe.Model(cfg.model)
  train.to_device(model, dev)
  model:train()
  local plan = recipe.plan and recipe.plan.pipeline
  if not (plan and model.embed and model.head) then
    errors.raise("tetra profile: recipe %s has no pipeline plan (plan.pipeline with " ..
                 "blocks, and model:embed / model:head)", tostring(recipe.name))
  end
  local blocks = model:get(plan.blocks)
  local rows = math.max(1, math.floor(layout.sizes(cfg).micro_batch))
  local T_len = cfg.model.seq_len
  local data = train.mock_data(cfg.model.vocab_size, t.seed or 0)
  -- On a GPU each reading waits for the device, so a part's time is its kernels'.
  local clock = function()
    if dev ~= C.TT_CPU then tffi.check(C.tt_cuda_synchronize()) end
    return metrics.now()
  end

  local n = #blocks
  local chain = { function(_, ids) return model:embed(ids) end }
  for i = 1, n do chain[i + 1] = function(x) return blocks[i](x) end end
  chain[n + 2] = function(x, _, targets)
    local logits = model:head(x)
    local loss = F.cross_entropy(logits, targets)
    free(logits)
    return loss
  end
  local samples = {}   -- part index -> { fwd = {}, bwd = {}, act = {} }
  for i = 1, n + 2 do samples[i] = { fwd = {}, bwd = {}, act = {} } end
  for rep = 0, reps do   -- rep 0 warms the allocator's cache and the caches: not kept
    local tokens = data:batch(rep + 1, rows, T_len, "train")
    local moved = T.moved(tokens, dev)
    local ids, targets = train.inputs_targets(moved)
    free(moved)
    collectgarbage()   -- the collector's pauses (tensors' finalizers) stay out of the times
    local f, b, a = time_chain(dev, clock, ids, targets, chain)
    if rep > 0 then
      for i = 1, n + 2 do
        local s = samples[i]
        s.fwd[rep], s.bwd[rep], s.act[rep] = f[i], b[i], a[i]
      end
    end
    free(ids); free(targets)
    model:zero_grad()
  end
  local op_prof
  if with_ops then
    local tokens = data:batch(reps + 2, rows, T_len, "train")
    local moved = T.moved(tokens, dev)
    local ids, targets = train.inputs_targets(moved)
    free(moved)
    collectgarbage()
    op_prof = ops.profile(dev, function()
      local x = chain[1](nil, ids, targets)
      for i = 2, n + 2 do
        local y = chain[i](x, ids, targets)
        free(x)
        x = y
      end
      F.backward(x)
      free(x)
    end)
    free(ids); free(targets)
    model:zero_grad()
  end
  local parts = {}
  for i = 1, n + 2 do
    local s = samples[i]
    parts[i] = { name = i == 1 and "embedding" or i == n + 2 and "head + loss" or
                        plan.blocks .. "." .. (i - 2),
                 forward_s = median(s.fwd), backward_s = median(s.bwd),
                 act_bytes = median(s.act) }
  end
  return { parts = parts, micro_rows = rows, seq_len = T_len, n_blocks = n, ops = op_prof }
end

-- -- Splitting -------------------------------------------------------------------------

-- The forward and the backward seconds of each stage for `counts` (blocks per stage),
-- 0-based as tetra.planner.replay takes them ({ [s] = { [0] = seconds } }): the embedding
-- on the first stage, the head on the last.
function M.stage_fb(parts, counts)
  local fwd, bwd, k = {}, {}, 2
  local S = #counts
  for s, c in ipairs(counts) do
    local f, b = 0, 0
    for _ = 1, c do
      f, b = f + parts[k].forward_s, b + parts[k].backward_s
      k = k + 1
    end
    if s == 1 then f, b = f + parts[1].forward_s, b + parts[1].backward_s end
    if s == S then
      local h = parts[#parts]
      f, b = f + h.forward_s, b + h.backward_s
    end
    fwd[s - 1], bwd[s - 1] = { [0] = f }, { [0] = b }
  end
  return fwd, bwd
end

-- The forward + backward seconds of each stage for `counts` (1-based).
function M.stage_times(parts, counts)
  local fwd, bwd = M.stage_fb(parts, counts)
  local out = {}
  for s = 1, #counts do out[s] = fwd[s - 1][0] + bwd[s - 1][0] end
  return out
end

-- The step `counts` predicts: the engine's own schedule (parallel.pipeline_schedule,
-- 1F1B by default) replayed over n_micro micro-batches with the stages' times
-- (tetra.planner.replay), transfers taken as free. Unlike (m + S - 1) x the slowest stage,
-- it counts the fill and drain of a split whose stages differ at what they cost.
function M.predict(parts, counts, n_micro, kind)
  local fwd, bwd = M.stage_fb(parts, counts)
  local lay = { pp = #counts, v = 1, schedule = kind or "1f1b" }
  return (plan_model.replay(lay, n_micro, fwd, bwd, 0))
end

-- The counts (blocks per stage, each at least one) over `stages` stages that make the
-- slowest stage fastest: dynamic programming over (stage, blocks so far).
function M.balanced_split(parts, stages)
  local n = #parts - 2
  local cost = {}   -- cost[i] = blocks 1..i, cumulative
  cost[0] = 0
  for i = 1, n do cost[i] = cost[i - 1] + parts[i + 1].forward_s + parts[i + 1].backward_s end
  local emb = parts[1].forward_s + parts[1].backward_s
  local head = parts[#parts].forward_s + parts[#parts].backward_s
  -- best[s][j]: the slowest of stages 1..s holding blocks 1..j; cut[s][j]: where stage s starts.
  local best, cut = { [0] = { [0] = 0 } }, {}
  for s = 1, stages do
    best[s], cut[s] = {}, {}
    for j = s, n - (stages - s) do
      for i = s - 1, j - 1 do
        local prev = best[s - 1][i]
        if prev then
          local own = cost[j] - cost[i] + (s == 1 and emb or 0) + (s == stages and j == n and head or 0)
          local v = math.max(prev, own)
          if best[s][j] == nil or v < best[s][j] then best[s][j], cut[s][j] = v, i end
        end
      end
    end
  end
  local counts, j = {}, n
  for s = stages, 1, -1 do
    local i = cut[s][j]
    counts[s] = j - i
    j = i
  end
  return counts
end

-- From the balanced split, moves one block at a time across a stage boundary while that
-- makes the predicted step (M.predict) shorter: the slowest stage decides most of a
-- step, the others' fill and drain the rest.
function M.best_split(parts, stages, n_micro, kind)
  local counts = M.balanced_split(parts, stages)
  local best = M.predict(parts, counts, n_micro, kind)
  local moved = true
  while moved do
    moved = false
    for s = 1, stages - 1 do
      for _, d in ipairs({ 1, -1 }) do   -- a block from stage s + 1 to s, or back
        local a, b = counts[s] + d, counts[s + 1] - d
        if a >= 1 and b >= 1 then
          local try = {}
          for i, c in ipairs(counts) do try[i] = c end
          try[s], try[s + 1] = a, b
          local t = M.predict(parts, try, n_micro, kind)
          if t < best * (1 - 1e-9) then counts, best, moved = try, t, true end
        end
      end
    end
  end
  return counts, best
end

-- -- Measuring -------------------------------------------------------------------------

local fs = require("tetra.util.fs")
local shell_quote = fs.shell_quote

-- The first line of a launcher's output that has words in it (mpirun frames its
-- messages in lines of dashes), or nil.
local function first_words(out)
  for line in out:gmatch("[^\n]+") do
    if line:find("%a") then return (line:gsub("^%s+", ""):gsub("%s+$", "")) end
  end
end

-- Trains `steps` steps of file with the given --set values and `counts` as
-- parallel.pipeline_stages under the launcher; returns the step times after the first
-- (from the metrics file) or nil and a message.
local function measure(opts, counts, world, tag)
  local tmp = os.tmpname()
  local mfile, log = tmp .. "-" .. tag .. ".jsonl", tmp .. "-" .. tag .. ".log"
  os.remove(tmp)
  local words = { opts.launcher, "-np", tostring(world), shell_quote(fs.self_exe() or "tetra"), "run",
                  shell_quote(opts.file) }
  local sets = {}
  for _, s in ipairs(opts.sets) do sets[#sets + 1] = s end
  for _, s in ipairs({ "train.steps=" .. opts.measure_steps, "log.metrics_file=" .. mfile,
                       "log.progress=false", "train.eval_every=0",
                       "train.warmup_steps=" .. math.min(opts.warmup, opts.measure_steps),
                       "parallel.pipeline_stages=" .. table.concat(counts, ",") }) do
    sets[#sets + 1] = s
  end
  for _, s in ipairs(sets) do
    words[#words + 1] = "--set"
    words[#words + 1] = shell_quote(s)
  end
  local cmd = table.concat(words, " ") .. " >" .. shell_quote(log) .. " 2>&1"
  local status = os.execute(cmd)
  local ok = status == 0
  local times = {}
  if ok then
    for i, r in ipairs(metrics.read(mfile)) do
      if i > 1 and type(r.step_time_s) == "number" then times[#times + 1] = r.step_time_s end
    end
  end
  local lf = io.open(log, "r")
  local out = lf and lf:read("*a") or ""
  if lf then lf:close() end
  os.remove(mfile); os.remove(log)
  if not ok or #times == 0 then
    return nil, "the run with parallel.pipeline_stages=" .. table.concat(counts, ",") ..
                " failed (" .. cmd .. "): " ..
                (out:match("(tetra[^\n]*)") or first_words(out) or
                 "exit status " .. tostring(status >= 256 and status / 256 or status) ..
                 ", no output")
  end
  return times
end

-- -- Command ---------------------------------------------------------------------------

local function parse_args(args)
  local o = { sets = {}, reps = 5, measure_steps = 8, measure_rounds = 2, launcher = "mpirun" }
  local i = 1
  local function value(flag)
    local v = args[i + 1]
    if v == nil then error({ usage = flag .. " needs a value" }) end
    i = i + 2
    return v
  end
  while i <= #args do
    local a = args[i]
    if a == "--set" then
      local kv = value(a)
      if not kv:find("=", 2, true) then error({ usage = "--set needs key=value, got '" .. kv .. "'" }) end
      o.sets[#o.sets + 1] = kv
    elseif a == "--reps" or a == "--measure-steps" or a == "--measure-rounds" then
      local v = value(a)
      local n = tonumber(v)
      if not n or n < 1 or n ~= math.floor(n) or (a == "--measure-steps" and n < 2) then
        error({ usage = a .. " needs a whole number" ..
                (a == "--measure-steps" and " of at least 2" or " of at least 1") ..
                ", got '" .. v .. "'" })
      end
      if a == "--reps" then o.reps = n
      elseif a == "--measure-steps" then o.measure_steps = n
      else o.measure_rounds = n end
    elseif a == "--ops" then
      o.ops = 25
      i = i + 1
      local n = tonumber(args[i] or "")
      if n then
        if n < 1 or n ~= math.floor(n) then
          error({ usage = "--ops takes a whole number of at least 1, got '" .. args[i] .. "'" })
        end
        o.ops = n
        i = i + 1
      end
    elseif a == "--no-measure" then
      o.measure_steps = 0
      i = i + 1
    elseif a == "--launcher" then
      o.launcher = value(a)
    elseif a:sub(1, 1) == "-" then
      error({ usage = "unknown option '" .. a .. "'" })
    elseif not o.file then
      o.file = a
      i = i + 1
    else
      error({ usage = "unexpected argument '" .. a .. "'" })
    end
  end
  if not o.file then error({ usage = "needs a RECIPE (a .lua recipe or a .yaml config)" }) end
  return o
end

local function ms(s) return string.format("%9.2f", s * 1e3) end
local function dev_clock(cfg)
  return (cfg.train.device or "cpu") == "cpu" and "the host clock" or "CUDA events"
end
local function mb(b) return string.format("%9.2f", b / 2^20) end

function M.main(...)
  local args = { ... }
  if args[1] == "--help" or args[1] == "-h" then
    print(USAGE)
    return 0
  end
  local ok, o = pcall(parse_args, args)
  if not ok then
    if type(o) == "table" and o.usage then return usage_error(o.usage .. " (" .. USAGE .. ")") end
    error(o, 0)
  end
  if (tonumber(os.getenv("OMPI_COMM_WORLD_SIZE") or os.getenv("PMI_SIZE") or "1") or 1) > 1 then
    return usage_error("run it as one process (it starts mpirun itself to measure the splits)")
  end
  local fh = io.open(o.file, "r")
  if not fh then return usage_error("cannot read " .. o.file) end
  fh:close()
  local recipe, cfg = config.load(o.file, o.sets, { world_size = false })
  if not recipe then return usage_error(o.file .. " is not a recipe (it returned no table with setup)") end
  local p, sizes = cfg.parallel or {}, layout.sizes(cfg)
  local S, world = sizes.pp, sizes.world
  if sizes.virtual > 1 then
    return usage_error("parallel.virtual_pipeline_size > 1: the profiler splits for one " ..
                       "chunk per stage; set it to 1")
  end

  local prof = M.profile(recipe, cfg, o.reps, o.ops ~= nil)
  local parts = prof.parts
  print(string.format("%s on %s: micro-batch %d x %d tokens, parts timed in one chain, " ..
                      "median of %d runs",
    o.file, cfg.train.device or "cpu", prof.micro_rows, prof.seq_len, o.reps))
  print(string.format("%-16s %9s %9s %9s %11s", "part", "fwd ms", "bwd ms", "total ms",
                      "act MiB"))
  local tf, tb, ta = 0, 0, 0
  for _, part in ipairs(parts) do
    print(string.format("%-16s %s %s %s %s", part.name, ms(part.forward_s),
      ms(part.backward_s), ms(part.forward_s + part.backward_s), "  " .. mb(part.act_bytes)))
    tf, tb, ta = tf + part.forward_s, tb + part.backward_s, ta + part.act_bytes
  end
  print(string.format("%-16s %s %s %s %s", "all", ms(tf), ms(tb), ms(tf + tb), "  " .. mb(ta)))
  if prof.ops then
    print(string.format("ops of one more micro-batch through the whole model, forward and " ..
                        "backward (%s; each interval between two taped ops charged to the " ..
                        "later one):", dev_clock(cfg)))
    print(ops.format(prof.ops, o.ops))
  end
  if S < 2 then
    print("parallel.pipeline_parallel_size is 1: no pipeline split to propose " ..
          "(--set parallel.pipeline_parallel_size=S)")
    return 0
  end

  local pipeline = require("tetra.parallel.pipeline")
  local uniform = pipeline.stage_layers(prof.n_blocks, S)
  local n_micro = sizes.micro_batches
  local kind = p.pipeline_schedule or "1f1b"
  local balanced = M.best_split(parts, S, n_micro, kind)
  local function describe(name, counts)
    local st = M.stage_times(parts, counts)
    local parts_s = {}
    for s, v in ipairs(st) do parts_s[s] = string.format("%.2f", v * 1e3) end
    local step = M.predict(parts, counts, n_micro, kind)
    print(string.format("%-9s pipeline_stages=%-12s stages (fwd+bwd ms) %s; predicted " ..
      "step %.1f ms", name, table.concat(counts, ","), table.concat(parts_s, " / "),
      step * 1e3))
    return step
  end
  print(string.format("pipeline over %d stages, %d micro-batches (%s, replayed with these " ..
                      "times; the optimizer and transfers left out):", S, n_micro, kind))
  local u = describe("uniform", uniform)
  local b = describe("balanced", balanced)
  local same = table.concat(uniform, ",") == table.concat(balanced, ",")
  if same then
    print("the uniform split is already the balanced one")
  else
    print(string.format("predicted: the balanced split is %.2fx as fast as the uniform one",
                        u / b))
  end
  print(string.format("paste: --set parallel.pipeline_stages=%s  (YAML: pipeline_stages: [%s])",
                      table.concat(balanced, ","), table.concat(balanced, ", ")))
  if same or o.measure_steps == 0 then return 0 end
  o.warmup = cfg.train.warmup_steps or 0

  -- The two splits take turns, so that a change in the machine's load between runs
  -- weighs on both alike.
  local pooled, ratios = { uniform = {}, balanced = {} }, {}
  for r = 1, o.measure_rounds do
    local round = {}
    for _, which in ipairs({ { "uniform", uniform }, { "balanced", balanced } }) do
      local times, err = measure(o, which[2], world, which[1])
      if not times then
        io.stderr:write("tetra profile: ", err, "\n")
        return 1
      end
      for _, v in ipairs(times) do table.insert(pooled[which[1]], v) end
      round[which[1]] = median(times)
    end
    ratios[r] = round.uniform / round.balanced
  end
  local measured = {}
  for _, name in ipairs({ "uniform", "balanced" }) do
    measured[name] = median(pooled[name])
    print(string.format("measured %-9s median step %.1f ms over %d steps (%d runs, %s -np %d)",
      name, measured[name] * 1e3, #pooled[name], o.measure_rounds, o.launcher, world))
  end
  print(string.format("measured: the balanced split is %.2fx as fast as the uniform one",
                      measured.uniform / measured.balanced))
  if #ratios >= 2 then
    -- Each round's two runs ran side by side in time: their ratio is freer of the
    -- machine's drifts than the pooled medians. The geometric mean and its 95% interval
    -- (two standard errors of the logs).
    local logs, words, sum = {}, {}, 0
    for i, x in ipairs(ratios) do
      logs[i], words[i] = math.log(x), string.format("%.2f", x)
      sum = sum + logs[i]
    end
    local mean, var = sum / #logs, 0
    for _, l in ipairs(logs) do var = var + (l - mean) ^ 2 end
    local half = 2 * math.sqrt(var / (#logs - 1) / #logs)
    print(string.format("per round: %s; geometric mean %.2fx (95%%: %.2f-%.2fx)",
      table.concat(words, " "), math.exp(mean), math.exp(mean - half), math.exp(mean + half)))
  end
  return 0
end

return M
