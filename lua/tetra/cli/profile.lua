-- tetra profile RECIPE [--set key=value]... [--reps N] [--measure-steps N]
--               [--measure-rounds R] [--no-measure] [--launcher CMD]
--
-- The layer profiler: builds the configured model whole on train.device and times the
-- forward and the backward of each part a pipeline stage can hold (the embedding, every
-- block, the head with its loss) on one micro-batch (train.batch_size / data parallel
-- size / train.gradient_accumulation_steps rows of model.seq_len tokens), the fastest of
-- --reps runs (default 5: the run least disturbed by the rest of the machine), and the activation memory each part's forward leaves for its
-- backward (what the allocator holds after it, less what it held before: the output and
-- every saved tensor). From these it proposes the split of the blocks over
-- parallel.pipeline_parallel_size stages whose slowest stage is fastest (the embedding's
-- time counts on the first stage, the head's on the last), prints it as
-- parallel.pipeline_stages, and the step time both splits predict: a 1F1B step of m
-- micro-batches over S stages takes about (m + S - 1) times the slowest stage's forward
-- and backward. Then it measures both: it trains --measure-steps steps (default 8) with
-- each split under `LAUNCHER -np WORLD tetra run ...` (default launcher: mpirun), the
-- splits taking turns --measure-rounds times (default 2), and compares the median step
-- times, each run's first step left out.
-- Exit 2 with one line on bad usage; config errors as `tetra run` gives them.
local ffi = require("ffi")
local config = require("tetra.config")
local metrics = require("tetra.metrics")
local T = require("tetra.tensor")
local F = require("tetra.nn.functional")
local tffi = require("tetra.ffi")
local train = require("tetra.train")

local C = ffi.C
local free = F.free
local M = {}

local USAGE = "usage: tetra profile RECIPE [--set key=value]... [--reps N] " ..
              "[--measure-steps N] [--measure-rounds R] [--no-measure] [--launcher CMD]"

local function usage_error(msg)
  io.stderr:write("tetra profile: ", msg, "\n")
  return 2
end

local function median(xs)
  local s = {}
  for i, x in ipairs(xs) do s[i] = x end
  table.sort(s)
  local n = #s
  if n == 0 then return nil end
  if n % 2 == 1 then return s[(n + 1) / 2] end
  return (s[n / 2] + s[n / 2 + 1]) / 2
end

local function min_of(xs)
  local m = math.huge
  for _, x in ipairs(xs) do m = math.min(m, x) end
  return m
end

-- -- Timing the parts ------------------------------------------------------------------

-- Times forward(x) -> y and the backward of y (from grad_of(y), or from y itself when
-- grad_of is nil: a scalar loss). x, when given, is made a leaf that requires grad, so the
-- backward stops there. Returns forward seconds, backward seconds, activation bytes.
local function time_part(dev, clock, x, forward, grad_of)
  if x then tffi.check(C.tt_set_requires_grad(x, 1)) end
  collectgarbage()   -- the collector's pauses (tensors' finalizers) stay out of the times
  local live0 = T.memory_stats(dev).live_bytes
  local t0 = clock()
  local y = forward(x)
  local t1 = clock()
  local act = T.memory_stats(dev).live_bytes - live0
  local g = grad_of and grad_of(y)
  local t2 = clock()
  if g then tffi.check(C.tt_backward_with(y, g)) else F.backward(y) end
  local t3 = clock()
  if g then free(g) end
  free(y)
  return t1 - t0, t3 - t2, act
end

-- The profile of cfg's model: { parts = { { name, forward_s, backward_s, act_bytes } ...
-- } (embedding, block 0 .. L-1, head), micro_rows, seq_len }.
function M.profile(recipe, cfg, reps)
  local dev = train.device(cfg.train.device)
  local t = cfg.train
  if t.threads and t.threads > 0 then C.tt_set_num_threads(t.threads) end
  C.tt_manual_seed(t.seed or 0)
  local model = recipe.Model(cfg.model)
  train.to_device(model, dev)
  model:train()
  local plan = recipe.plan and recipe.plan.pipeline
  if not (plan and model.embed and model.head) then
    error({ message = "tetra profile: recipe " .. tostring(recipe.name) .. " has no " ..
            "pipeline plan (plan.pipeline with blocks, and model:embed / model:head)",
            user = true }, 0)
  end
  local blocks = model:get(plan.blocks)
  local p = cfg.parallel or {}
  local rows = t.batch_size / (p.data_parallel_size or 1) /
               (t.gradient_accumulation_steps or 1)
  rows = math.max(1, math.floor(rows))
  local T_len, dim = cfg.model.seq_len, cfg.model.dim
  local data = train.mock_data(cfg.model.vocab_size, t.seed or 0)
  -- On a GPU each reading waits for the device, so a part's time is its kernels'.
  local clock = function()
    if dev ~= C.TT_CPU then tffi.check(C.tt_cuda_synchronize()) end
    return metrics.now()
  end
  local ones = function(y) return T.ones(y:shape(), { device = dev }) end

  local n = #blocks
  local samples = {}   -- part index -> { fwd = {}, bwd = {}, act = {} }
  for i = 1, n + 2 do samples[i] = { fwd = {}, bwd = {}, act = {} } end
  local function record(i, f, b, a)
    local s = samples[i]
    s.fwd[#s.fwd + 1], s.bwd[#s.bwd + 1], s.act[#s.act + 1] = f, b, a
  end
  for rep = 0, reps do   -- rep 0 warms the allocator's cache and the caches: not kept
    local tokens = data:batch(rep + 1, rows, T_len, "train")
    local moved = T.moved(tokens, dev)
    local ids, targets = train.inputs_targets(moved)
    free(moved)
    local f, b, a = time_part(dev, clock, nil, function() return model:embed(ids) end, ones)
    if rep > 0 then record(1, f, b, a) end
    for i = 1, n do
      local x = T.randn({ rows, T_len, dim }, { device = dev })
      f, b, a = time_part(dev, clock, x, function(h) return blocks[i](h) end, ones)
      free(x)
      if rep > 0 then record(i + 1, f, b, a) end
    end
    local h = T.randn({ rows, T_len, dim }, { device = dev })
    f, b, a = time_part(dev, clock, h, function(x)
      local logits = model:head(x)
      local loss = F.cross_entropy(logits, targets)
      free(logits)
      return loss
    end)
    free(h)
    if rep > 0 then record(n + 2, f, b, a) end
    free(ids); free(targets)
    model:zero_grad()
  end
  local parts = {}
  for i = 1, n + 2 do
    local s = samples[i]
    parts[i] = { name = i == 1 and "embedding" or i == n + 2 and "head + loss" or
                        plan.blocks .. "." .. (i - 2),
                 forward_s = min_of(s.fwd), backward_s = min_of(s.bwd),
                 act_bytes = median(s.act) }
  end
  return { parts = parts, micro_rows = rows, seq_len = T_len, n_blocks = n }
end

-- -- Splitting -------------------------------------------------------------------------

-- The forward + backward seconds of each stage for `counts` (blocks per stage): the
-- embedding on the first stage, the head on the last.
function M.stage_times(parts, counts)
  local out, k = {}, 2
  for s, c in ipairs(counts) do
    local sum = 0
    for _ = 1, c do
      sum = sum + parts[k].forward_s + parts[k].backward_s
      k = k + 1
    end
    out[s] = sum
  end
  out[1] = out[1] + parts[1].forward_s + parts[1].backward_s
  local h = parts[#parts]
  out[#out] = out[#out] + h.forward_s + h.backward_s
  return out
end

local function max_of(xs)
  local m = -math.huge
  for _, x in ipairs(xs) do m = math.max(m, x) end
  return m
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

-- -- Measuring -------------------------------------------------------------------------

pcall(ffi.cdef, "long readlink(const char *path, char *buf, size_t size);")

local function self_exe()
  local buf = ffi.new("char[4096]")
  local n = C.readlink("/proc/self/exe", buf, 4095)
  if n <= 0 then return "tetra" end
  return ffi.string(buf, n)
end

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Trains `steps` steps of file with the given --set values and `counts` as
-- parallel.pipeline_stages under the launcher; returns the step times after the first
-- (from the metrics file) or nil and a message.
local function measure(opts, counts, world, tag)
  local tmp = os.tmpname()
  local mfile, log = tmp .. "-" .. tag .. ".jsonl", tmp .. "-" .. tag .. ".log"
  os.remove(tmp)
  local words = { opts.launcher, "-np", tostring(world), shell_quote(self_exe()), "run",
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
                (out:match("(tetra[^\n]*)") or out:match("([^\n]+)\n?$") or
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
  local p = cfg.parallel or {}
  local S = p.pipeline_parallel_size or 1
  local world = S * (p.tensor_parallel_size or 1) * (p.data_parallel_size or 1) *
                (p.context_parallel_size or 1)
  if (p.virtual_pipeline_size or 1) > 1 then
    return usage_error("parallel.virtual_pipeline_size > 1: the profiler splits for one " ..
                       "chunk per stage; set it to 1")
  end

  local prof = M.profile(recipe, cfg, o.reps)
  local parts = prof.parts
  print(string.format("%s on %s: micro-batch %d x %d tokens, fastest of %d runs",
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
  if S < 2 then
    print("parallel.pipeline_parallel_size is 1: no pipeline split to propose " ..
          "(--set parallel.pipeline_parallel_size=S)")
    return 0
  end

  local pipeline = require("tetra.parallel.pipeline")
  local uniform = pipeline.stage_layers(prof.n_blocks, S)
  local balanced = M.balanced_split(parts, S)
  local n_micro = cfg.train.gradient_accumulation_steps or 1
  local factor = n_micro + S - 1
  local function describe(name, counts)
    local st = M.stage_times(parts, counts)
    local parts_s = {}
    for s, v in ipairs(st) do parts_s[s] = string.format("%.2f", v * 1e3) end
    print(string.format("%-9s pipeline_stages=%-12s stages (fwd+bwd ms) %s; predicted " ..
      "1F1B step %.1f ms", name, table.concat(counts, ","), table.concat(parts_s, " / "),
      factor * max_of(st) * 1e3))
    return max_of(st)
  end
  print(string.format("pipeline over %d stages, %d micro-batches (1F1B: (m + S - 1) x " ..
                      "the slowest stage):", S, n_micro))
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
  local pooled = { uniform = {}, balanced = {} }
  for _ = 1, o.measure_rounds do
    for _, which in ipairs({ { "uniform", uniform }, { "balanced", balanced } }) do
      local times, err = measure(o, which[2], world, which[1])
      if not times then
        io.stderr:write("tetra profile: ", err, "\n")
        return 1
      end
      for _, v in ipairs(times) do table.insert(pooled[which[1]], v) end
    end
  end
  local measured = {}
  for _, name in ipairs({ "uniform", "balanced" }) do
    measured[name] = median(pooled[name])
    print(string.format("measured %-9s median step %.1f ms over %d steps (%d runs, %s -np %d)",
      name, measured[name] * 1e3, #pooled[name], o.measure_rounds, o.launcher, world))
  end
  print(string.format("measured: the balanced split is %.2fx as fast as the uniform one",
                      measured.uniform / measured.balanced))
  return 0
end

return M
