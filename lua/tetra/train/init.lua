-- tetra.train: the training loop recipes share.
--
--   local env = train.setup(cfg, model, data, { plan = plan })  -- parallelism, precision,
--                                                               -- optimizer, metrics
--   train.run(env)                                              -- steps, eval, progress
--
-- One optimizer step (env.step), the same for every layout:
--   global batch (train.batch_size sequences) -> train.device -> this data-parallel rank's
--   rows -> the step strategy (tetra.parallel.step: plain, or pipelined over the stages)
--   runs forward and backward of train.gradient_accumulation_steps micro-batches and
--   leaves the gradients of the global batch's mean loss in place (x the fp16 scale)
--   -> fp16: grads / loss scale, inf/NaN check agreed over every rank
--   -> clip to max_grad_norm by the norm of the whole model (tetra.parallel, from the
--      parameters' placements) -> AdamW with the scheduled lr, unless the grads were not
--      finite: then the step is skipped (and the fp16 scale backs off)
--   -> zero grads -> one metrics record (with loss_scale and skipped).
-- The loss guard (tetra.train.guard, train.loss_guard) judges each step from the mean loss and
-- the gradient norm, agreed over every rank: a bad step skips the update, and
-- train.max_bad_steps of them in a row roll back to the latest checkpoint and skip their
-- data (train.roll_back); step s reads the global batch at data position
-- env.guard:position(s), which is s until a window was skipped.
--
-- The model is built whole on the CPU by the recipe (so a seed gives the same initial
-- weights on every rank and device); train.setup then applies the layout's parallelism
-- from the recipe's plan (tetra.parallel.apply), the precision (train.precision through
-- tetra.amp) and moves the parameters to train.device (cpu, cuda, cuda:N); the optimizer
-- state is created beside them and each batch is moved as it is drawn.
--
-- A data source is any object with `:batch(step, batch_size, seq_len, split)` returning
-- int64 tokens (batch_size, seq_len + 1) for that step (split "train" or "val"); it must
-- depend only on (seed, step, split) so that every rank and every layout sees the same
-- global batch. train.mock_data and tetra.data.bytetok.dataset are two such sources. A source
-- with `local_rows` set (tetra.data's) returns this data-parallel rank's rows of the
-- global batch instead, and reads and tokenizes only those.
local ffi = require("ffi")
local C = require("tetra.ffi").C
local F = require("tetra.nn.functional")
local graph = require("tetra.train.graph")
local optim = require("tetra.optim")
local metrics = require("tetra.obs.metrics")
local amp = require("tetra.optim.amp")
local checkpoint = require("tetra.checkpoint")
local tffi = require("tetra.ffi")
local telemetry = require("tetra.obs.telemetry")
local mfu = require("tetra.obs.mfu")
local trace = require("tetra.obs.trace")

local train = {}

local free = F.free

-- A user-facing error: the tetra binary prints the message alone, without a traceback.
local user_error = require("tetra.util.errors").raise

-- -- Data --------------------------------------------------------------------------------

local MockData = {}
MockData.__index = MockData

-- Uniform random tokens in [0, vocab_size) drawn from (seed, step, split), leaving the
-- engine's RNG stream (used for initialisation) where it was.
function train.mock_data(vocab_size, seed)
  return setmetatable({ vocab_size = vocab_size, seed = seed or 0 }, MockData)
end

local shape2 = ffi.new("int64_t[2]")
local pout = require("tetra.tensor").pout
local take = require("tetra.tensor").take

-- A well-mixed 64-bit seed for (seed, step, stream) (splitmix64 finaliser): nearby
-- inputs give unrelated generator states.
function train.mix_seed(seed, step, stream)
  local x = ffi.new("uint64_t", seed) * 0x9E3779B97F4A7C15ULL + ffi.new("uint64_t", step)
  x = x * 0xBF58476D1CE4E5B9ULL + ffi.new("uint64_t", stream or 0)
  x = bit.bxor(x, bit.rshift(x, 30)) * 0xBF58476D1CE4E5B9ULL
  x = bit.bxor(x, bit.rshift(x, 27)) * 0x94D049BB133111EBULL
  return bit.bxor(x, bit.rshift(x, 31))
end

function MockData:batch(step, batch_size, seq_len, split)
  local saved = C.tt_rng_state()
  C.tt_manual_seed(train.mix_seed(self.seed, step, split == "val" and 1 or 0))
  shape2[0], shape2[1] = batch_size, seq_len + 1
  local status = C.tt_tensor_randint(shape2, 2, 0, self.vocab_size, C.TT_I64, pout)
  C.tt_rng_set_state(saved)
  return take(status, 2)
end

local function read_text(path)
  local f, err = io.open(path, "rb")
  if not f then user_error("data.input_path: cannot read " .. path .. ": " .. tostring(err)) end
  local s = f:read("*a")
  f:close()
  local nul = s:find("%z")
  if nul then   -- a binary handed over as text would train on garbage, silently
    user_error(string.format("data.input_path: %s is not text (a NUL byte at offset %d)",
                             path, nul - 1))
  end
  return s
end

-- The data source cfg.data asks for, and its tokenizer (nil for mock data):
--   data.mock = true         random tokens from data.seed / train.seed
--   data.tokenizer = "byte"  (the default) the text of data.input_path (a path, a comma
--                            list or a Lua list of paths) in memory, one token per byte;
--                            needs model.vocab_size >= 256
--   otherwise                tetra.data's pipeline (BPE from data.tokenizer or
--                            data.vocab_file + data.merges_file)
function train.data_source(cfg)
  local d = cfg.data or {}
  local seed = d.seed or cfg.train.seed or 0
  if d.mock then return train.mock_data(cfg.model.vocab_size, seed), nil end
  if not d.input_path or d.input_path == "" then
    error("data: set data.input_path to a text file, or data.mock=true", 0)
  end
  local offline = d.online_tokenization == false
  if (d.tokenizer == nil or d.tokenizer == "byte") and not d.vocab_file and not offline then
    local bytetok = require("tetra.data.bytetok")
    if cfg.model.vocab_size < bytetok.vocab_size then
      error(string.format("model.vocab_size (%d) must be at least %d for byte-level text",
        cfg.model.vocab_size, bytetok.vocab_size), 0)
    end
    local paths, texts = d.input_path, {}
    if type(paths) ~= "table" then
      paths = {}
      for p in tostring(d.input_path):gmatch("[^,]+") do paths[#paths + 1] = p end
    end
    for i, p in ipairs(paths) do texts[i] = read_text(p) end
    return bytetok.dataset(table.concat(texts, "\n"), { seed = seed }), bytetok.tokenizer
  end
  local data = require("tetra.data")
  local dp = require("tetra.dist").init(cfg).dp
  -- GPT-2's layout: vocab.json with merges.txt beside it.
  if d.vocab_file and not d.merges_file and d.vocab_file:match("vocab%.json$") then
    local merges = d.vocab_file:gsub("vocab%.json$", "merges.txt")
    local f = io.open(merges, "r")
    if f then
      f:close()
      d.merges_file = merges
    end
  end
  -- The tokenizer and the training files open here, before any model is built, and a
  -- problem with them is one line.
  local ok, src, tok = pcall(function()
    -- Prepared shards need no tokenizer (one, if given, decodes samples).
    local tok = d.vocab_file and data.tokenizer(d.vocab_file, d.merges_file)
                or (d.tokenizer and d.tokenizer ~= "byte" or not offline) and
                   data.tokenizer(d.tokenizer) or nil
    local src = data.source(cfg, dp)
    src:loader("train")
    return src, tok
  end)
  if not ok then
    local msg = "data: " .. tostring(src):gsub("^[^:]*%.lua:%d+: ", "")
    if offline then
      msg = msg .. " (data.online_tokenization=false reads prepared token shards: make " ..
            "them with `tetra data prepare --tokenizer TOKENIZER --out DIR FILES`, then " ..
            "data.input_path=DIR/*.tok)"
    end
    user_error(msg)
  end
  return src, tok
end

-- tokens (b, T + 1) -> inputs (b, T), targets (b, T), both contiguous.
train.inputs_targets = F.inputs_targets

-- Mean cross-entropy of an unsplit model on tokens (b, T + 1); the logits are freed at
-- once. (A split model's loss is its step strategy's: tetra.parallel.step.)
function train.loss(model, tokens)
  local ids, targets = train.inputs_targets(tokens)
  local logits = model(ids)                         -- (b, T, V)
  local loss = F.cross_entropy(logits, targets)
  free(logits); free(ids); free(targets)
  return loss
end

-- -- Device --------------------------------------------------------------------------

-- The engine device id for train.device (C.TT_CPU for "cpu"), the device started.
train.device = require("tetra.device").start

-- Moves every parameter of model to device `dev` (an engine device id) as a new leaf
-- that requires grad, replacing it in its module. A tensor shared by two modules (tied
-- embeddings) becomes one shared copy. Call before building the optimizer.
function train.to_device(model, dev)
  local moved = {}
  for _, nm in ipairs(model:named_modules()) do
    local m = nm[2]
    for _, name in ipairs(m._param_names) do
      local p = m[name]
      if p ~= nil and p._device ~= dev then
        local key = tostring(ffi.cast("uintptr_t", ffi.cast("void *", p)))
        if not moved[key] then
          local d = take(C.tt_to_device(p, dev, pout))
          tffi.check(C.tt_set_requires_grad(d, 1))
          moved[key] = d
        end
        m[name] = moved[key]
      end
    end
  end
end

local to_dev = require("tetra.tensor").moved

-- Batches to device `dev` without a wait for the GPU (a plain copy from pageable memory
-- waits for it): through two page-locked staging buffers used in turns. The copy from a
-- buffer is in stream order before the step's one read of its stats, so by the time the
-- buffer's turn comes again (two steps later) it has finished. On the CPU: the batch.
-- upload(host, into): into a device tensor of the batch's shape and dtype instead (the
-- static input of a captured step), also on the CPU.
local function upload_check(host, into)
  if into._dtype ~= host._dtype or into:numel() ~= host:numel() then
    error("train: a batch of another shape or dtype than the captured step's input", 3)
  end
end

local function uploader(dev)
  if dev == C.TT_CPU then
    return function(t, into)
      if not into then return t end
      upload_check(t, into)
      tffi.check(C.tt_copy_(into, t))
      free(t)
      return into
    end
  end
  tffi.cdef_header("tetra_cuda.h")
  local bufs, sizes, turn = {}, { 0, 0 }, 0
  local box = ffi.new("void *[1]")
  return function(host, into)
    if into then upload_check(host, into) end
    local c = host
    if not host:is_contiguous() then c = host:contiguous() end
    local n = tonumber(C.tt_tensor_numel(c)) * tonumber(C.tt_dtype_size(c._dtype))
    turn = turn % 2 + 1
    if sizes[turn] < n then
      if bufs[turn] then C.tt_cuda_host_free(bufs[turn]) end
      tffi.check(C.tt_cuda_host_alloc(n, box))
      bufs[turn], sizes[turn] = box[0], n
    end
    ffi.copy(bufs[turn], C.tt_tensor_data(c), n)
    local out = into or F.empty(host:shape(), c._dtype, dev)
    if n > 0 then
      tffi.check(C.tt_cuda_copy_to_device_async(C.tt_tensor_data(out), dev, bufs[turn], n))
    end
    if c ~= host then free(c) end
    free(host)
    return out
  end
end

-- -- Setup -------------------------------------------------------------------------------

-- Builds the training environment: env.model, env.optimizer, env.data, env.cfg, env.mesh,
-- env.ddp, env.schedule, env.amp (the tetra.amp context of train.precision), env.device
-- (the engine device id of train.device), env.step() (one optimizer step, returns its
-- metrics record), env.evaluate([n_batches]) and env.generate(prompt_ids, opts).
-- The model (built whole, on the CPU) is split for the layout, wrapped for the precision
-- and moved to train.device here; env.par is tetra.parallel.apply's result.
-- opts: plan (the model's parallel plan, recipes/NAME/plan.lua; needed for tensor, context or
-- pipeline parallelism), tokenizer (tok:encode(text), tok:decode(ids); for samples),
-- on_grads(env, step) (see env.step; eager steps only: a replayed step runs no Lua),
-- graph_check (train.cuda_graphs' steps on the CPU in tetra.train.graph's check mode, for tests).
-- Metrics record of a step: step, loss, lr, grad_norm (before clipping; nil on a skipped
-- step), tokens, tokens_per_s, step_time_s, data_wait_s, exposed_comm_s (seconds blocked
-- on communication: what computation did not hide, pipeline bubbles included),
-- loss_scale (the fp16 scale after this step's update; 1 in other precisions), skipped
-- (true when inf/NaN grads skipped the optimizer step); this rank's param_bytes,
-- grad_bytes, optimizer_bytes, peak_bytes (the allocator's high-water mark during the
-- step) and step_peak_bytes (how far the step rose above what it started with:
-- activations, gradients, communication buffers), live_bytes and cached_bytes (after the
-- optimizer update). The step's time by phase, which add up to step_time_s: data_wait_s,
-- forward_s and backward_s (computing, waits left out), exposed_comm_s, optimizer_s
-- (clipping, the update, zeroing; waits left out), other_s; a step replayed from a CUDA
-- graph (train.cuda_graphs) has graph_s instead (forward, backward and the update in one
-- timing; forward_s, backward_s and optimizer_s are 0). mfu (0-1) when the device's
-- peak is known (tetra.obs.mfu; train.peak_tflops). train.run adds checkpoint_s (the loop's
-- time on checkpoints since the previous record) and eval_loss.
function train.setup(cfg, model, data, opts)
  opts = opts or {}
  local t, o = cfg.train, cfg.optim or {}
  if t.threads and t.threads > 0 then C.tt_set_num_threads(t.threads) end
  local parallel = require("tetra.parallel")
  -- A config built in code has not met tetra.config's checks: the layout's are cheap.
  require("tetra.config").check_layout(cfg, require("tetra.config").world_size())
  local lay = require("tetra.parallel.layout").sizes(cfg)
  local dist = require("tetra.dist")
  local mesh = dist.init(cfg)
  if (lay.tp > 1 or lay.cp > 1 or lay.pp > 1) and not opts.plan then
    dist.fail("this model has no parallel plan, so it runs with data parallelism only: " ..
              "set parallel.tensor/context/pipeline_parallel_size to 1, or give " ..
              "train.setup a plan (recipes/llama/plan.lua is one)")
  end
  -- MFU counts the FLOPs of the whole model, so they are counted before it is split.
  local flops_per_token = mfu.flops_per_token(model, cfg.model)
  local par = parallel.apply(model, opts.plan, mesh, cfg)
  -- The whole model was built on every rank and apply kept this rank's slices: the rest
  -- is garbage the Lua GC may not visit for a long time (it sees small handles, not the
  -- bytes behind them). Collected now, it stops counting in every step's memory.
  collectgarbage()
  -- FP8 layers agree their amaxes over every rank that runs them (the stage's tp x cp x
  -- dp ranks), so that the scales are those of one process on the whole batch.
  local amax_group
  if t.precision == "fp8" and lay.tp * lay.cp * lay.dp > 1 then
    amax_group = lay.pp == 1 and mesh.world or
                 mesh.world:split(mesh.coords.pp, mesh.rank, "fp8 amax (tp x cp x dp)")
  end
  local ctx = amp.wrap(model, cfg, { amax_group = amax_group, partial = lay.pp > 1,
                                     fail = dist.fail })
  local dev = train.device(t.device)
  if t.cuda_graphs and dev ~= C.TT_CPU then
    -- A capture needs a stream of its own (the legacy default stream cannot be
    -- captured): the whole run goes on it, so the warm-up steps grow the allocator's
    -- cache and make the GEMM workspaces there. It lives as long as the process.
    local box = ffi.new("tt_cuda_stream *[1]")
    tffi.check(C.tt_cuda_stream_create(box))
    tffi.check(C.tt_cuda_set_stream(box[0]))
  end
  if dev ~= C.TT_CPU then train.to_device(model, dev) end
  par.device = dev
  local peak_tflops = mfu.peak_tflops(cfg, mfu.device_name(dev))
  if not peak_tflops and dev ~= C.TT_CPU and mesh.rank == 0 then
    print(string.format("mfu: no peak known for %s (%s); set train.peak_tflops to report MFU",
                        mfu.device_name(dev), t.precision or "fp32"))
  end
  telemetry.start(cfg, mesh, dev ~= C.TT_CPU and dev or nil)
  trace.setup(cfg, mesh)
  local params = {}
  for i, e in ipairs(par:placements()) do params[i] = { e.name, e.tensor } end
  local ddp = parallel.data.wrap(par:placements(), mesh, cfg, par.model)
  local accum = t.gradient_accumulation_steps or 1
  local seq_len = cfg.model.seq_len

  local optimizer
  if o.name == "sgd" then
    optimizer = optim.SGD(params, { lr = t.lr, momentum = o.momentum,
                                    weight_decay = t.weight_decay })
  else
    optimizer = optim.AdamW(params, { lr = t.lr, beta1 = o.beta1, beta2 = o.beta2,
                                      eps = o.eps, weight_decay = t.weight_decay })
  end
  ddp:attach_optimizer(optimizer)   -- ZeRO-1 keeps this rank's optimizer shard only
  -- The norm of the whole model: local unless some parameters are split or sharded.
  local shards = ddp.shards
  local clip
  local clip_async   -- the same leaving the norm on the device (AdamW)
  if par:global_norm() or shards then
    clip = function(max_norm) return par:clip_grad_norm(optimizer, max_norm, shards) end
    clip_async = function(max_norm) par:clip_grad_norm(optimizer, max_norm, shards, true) end
  else
    clip = function(max_norm) return optimizer:clip_grad_norm(max_norm) end
    clip_async = function(max_norm) optimizer:clip_grad_norm_async(max_norm) end
  end
  local strategy = require("tetra.parallel.step").new(par, ddp, ctx, cfg)
  local env = {
    cfg = cfg, model = model, data = data, mesh = mesh, ddp = ddp, optimizer = optimizer,
    par = par, tokenizer = opts.tokenizer, rank = mesh.rank or 0, amp = ctx, device = dev,
    schedule = optim.schedule({ lr = t.lr, min_lr = t.min_lr, warmup_steps = t.warmup_steps,
                                steps = t.steps, schedule = t.lr_schedule }),
    step_count = 0, tokens_seen = 0,
  }

  -- The logged loss is the mean over the ranks that hold different tokens (dp x cp).
  local function global_mean(x) return mesh.dpcp:mean(x) end

  -- opts.on_grads(env, step), when given, runs once the grads are complete (after the
  -- data-parallel averaging, before unscaling and clipping): tests inject overflows there.
  local on_grads = opts.on_grads

  -- The loss guard (tetra.train.guard): its verdict is the worst over every rank, so that all
  -- of them skip (and roll back) together. Reasons are ordered by how bad they are.
  local guard = require("tetra.train.guard").new(cfg)
  env.guard = guard
  local reasons = { "spike", "nonfinite_grad", "nonfinite_loss" }
  local flag = nil
  local function agree(reason)
    local w = mesh.world
    if not w or w.size == 1 then return reason end
    local code = 0
    for i, name in ipairs(reasons) do if reason == name then code = i end end
    flag = flag or require("tetra.tensor").from_table({ 0 })
    C.tt_tensor_set(flag, 0, code)
    w:all_reduce(flag, "max")
    return reasons[tonumber(C.tt_tensor_get(flag, 0))]
  end
  -- tetra launch's restart count (0 outside it), for the metrics records.
  local restarts = tonumber(os.getenv("TETRA_RESTART_COUNT") or "") or 0

  -- On CUDA, embedding ids and cross-entropy targets are checked on the device during
  -- forward and backward, without a wait each; the optimizer's one read of its stats
  -- reports a bad one (tetra.optim's read_stats; SGD has none: checked at once there).
  local deferred_checks = dev ~= C.TT_CPU and optimizer.read_stats ~= nil
  -- fp16 with AdamW: the loss scale is written into the optimizer's stats before each
  -- step and read there on the device (the backward's seed, the unscale).
  if ctx.scaler and optimizer.stats_tensor then ctx:use_stats_scale(optimizer:stats_tensor()) end
  local function forward_backward(tokens, n)
    if not deferred_checks then return strategy:forward_backward(tokens, n) end
    tffi.check(C.tt_cuda_set_deferred_checks(1))
    local ok, res = pcall(strategy.forward_backward, strategy, tokens, n)
    tffi.check(C.tt_cuda_set_deferred_checks(0))
    if not ok then error(res, 0) end
    return res
  end

  -- The mean loss over the ranks (dp x cp) into the optimizer's stats beside the norm and
  -- found_inf, then fp16's unscale, the clip and the update launched (the device skips
  -- the update when a gradient, the norm or the loss is not finite): no read.
  local function launch_update(loss_sum, lr)
    local opt = env.optimizer
    local mean = F.scale(loss_sum, 1.0 / (accum * mesh.dpcp.size))
    free(loss_sum)
    if mesh.dpcp.size > 1 then mesh.dpcp:all_reduce(mean, "sum") end
    tffi.check(C.tt_step_stats_set_loss(opt:stats(), mean))
    free(mean)
    ctx:step_launch(opt.params, function() ddp:optimizer_step(opt, lr) end,
                    function() clip_async(t.max_grad_norm) end, mesh.world, opt)
  end

  -- train.cuda_graphs: after `warmup` eager steps (the allocator's cache grown, the bf16
  -- copies set up), the next step's forward, backward and update are captured into one
  -- CUDA graph (tetra.train.graph) reading the batch from a static input tensor, and every step
  -- from then on copies its batch there, writes its learning rate and bias corrections
  -- into the optimizer's stats (AdamW:set_update) and replays the graph: no Lua and no
  -- launch per kernel, and still one read per step. opts.graph_check runs the same steps
  -- on the CPU in tetra.train.graph's check mode (tests).
  local graphs = nil
  if t.cuda_graphs or opts.graph_check then
    graphs = { warmup = 2, check = opts.graph_check and true or false }
  end
  env.graphs = graphs
  -- Drops the captured step (the next step captures again): after anything that moves or
  -- replaces tensors the graph reads (a roll-back, a checkpoint load).
  function env.drop_graph()
    if graphs and graphs.graph then
      graphs.graph:close()
      graphs.graph = nil
      if graphs.input then free(graphs.input) end
      graphs.input = nil
      env.optimizer.external_update = nil
    end
  end
  local null_timer = require("tetra.obs.timer").null()

  -- What the device reads of the host's decisions, written into the optimizer's stats
  -- before each step (no wait): fp16's loss scale, the loss guard's spike limit.
  local function write_step_inputs()
    ctx:write_scale()
    if guard.enabled and guard.zscore > 0 and optimizer.stats_tensor then
      tffi.check(C.tt_step_stats_set_loss_limit(optimizer:stats_tensor(), guard:loss_limit()))
    end
  end

  local mem = ffi.new("tt_alloc_stats")
  local upload = uploader(dev)
  -- The end of a step, eager or replayed (s: what the step measured and decided): the
  -- guard's verdict agreed over the ranks, the grads and the tape dropped, the record.
  local function finish_step(s)
    local step = s.step
    local bad = guard.enabled and agree(s.bad) or nil
    local roll_back = guard:finish(step, s.pos, s.loss, bad)
    C.tt_alloc_stats_get(dev, mem)
    local peak = tonumber(mem.peak_bytes)
    model:zero_grad()
    C.tt_tape_clear()   -- drops any recorded branch no backward reached
    if trace.on then trace.span("optimizer", s.ow0, metrics.now(), { step = step }) end
    env.step_count = step
    local tokens = t.batch_size * seq_len
    env.tokens_seen = env.tokens_seen + tokens
    local t0, data_wait = s.t0, s.data_wait
    local dt = metrics.now() - t0
    local exposed = C.tt_dist_wait_seconds() - s.wait0
    local r = { step = step, loss = s.loss, lr = s.lr,
                grad_norm = s.grad_norm, tokens = env.tokens_seen, tokens_per_s = tokens / dt,
                step_time_s = dt, data_wait_s = data_wait,
                exposed_comm_s = exposed, forward_s = s.forward, backward_s = s.fb - s.forward,
                optimizer_s = s.optimizer_s, graph_s = s.graph_s,
                other_s = dt - data_wait - s.fb - exposed - s.optimizer_s - (s.graph_s or 0),
                live_bytes = tonumber(mem.live_bytes), cached_bytes = tonumber(mem.cached_bytes),
                param_bytes = env.memory.params, grad_bytes = env.memory.grads,
                optimizer_bytes = env.memory.optimizer, peak_bytes = peak,
                step_peak_bytes = peak - s.live0,
                loss_scale = ctx:scale(), skipped = s.skipped, restarts = restarts,
                guard = bad, data_position = s.pos, roll_back = roll_back or nil }
    if data.stats then   -- tetra.data's loader reports its own throughput and queue
      local st = data:stats()
      r.loader_tokens_per_s, r.loader_queue_depth = st.tokens_per_s, st.queue_depth
    end
    if peak_tflops and peak_tflops > 0 then
      r.mfu = flops_per_token * tokens / dt / (peak_tflops * 1e12 * (mesh.size or 1))
    end
    telemetry.step(r)
    if trace.on then trace.span("step " .. step, t0, t0 + dt, { loss = r.loss }) end
    return r
  end

  -- A step of the captured graph (train.cuda_graphs, after the warm-up): the batch is in
  -- the static input `global`; the first such step captures, every one replays.
  local function graph_step(step, pos, t0, wait0, live0, data_wait, global)
    local opt, lr = env.optimizer, env.schedule(step)
    local timer = strategy.timer
    opt.external_update = true
    opt:set_update(lr)
    if not graphs.graph then
      local g = graph.new(dev, { check = graphs.check, readers = { opt } })
      -- No timing marks inside: the graph is timed as a whole.
      local ok, err = pcall(g.capture, g, function()
        local timed = strategy.timer
        strategy.timer = null_timer
        local done, why = pcall(function()
          launch_update(forward_backward(global, accum), lr)
        end)
        strategy.timer = timed
        if not done then error(why, 0) end
      end)
      if not ok then
        g:close()
        user_error(string.format("train.cuda_graphs: capturing step %d failed: %s (set " ..
                                 "train.cuda_graphs=false to train without graphs)", step,
                                 tostring(type(err) == "table" and err.message or err)))
      end
      graphs.graph = g
    end
    local ow0 = metrics.now()
    local g0 = timer:mark()
    graphs.graph:replay()
    local g1 = timer:mark()
    local skipped, grad_norm, loss = ctx:step_finish(opt)
    local bad = guard:judge_loss(loss, opt.last_stats.spike)
    if skipped and not bad and guard.enabled and not ctx.scaler then bad = "nonfinite_grad" end
    return finish_step({ step = step, pos = pos, t0 = t0, wait0 = wait0, live0 = live0,
                         data_wait = data_wait, lr = lr, loss = loss, bad = bad,
                         skipped = skipped, grad_norm = grad_norm, ow0 = ow0, fb = 0,
                         forward = 0, optimizer_s = 0, graph_s = timer:seconds(g0, g1) })
  end

  function env.step()
    local step = env.step_count + 1
    trace.begin_step(step)
    local t0, wait0 = metrics.now(), C.tt_dist_wait_seconds()
    C.tt_alloc_stats_get(dev, mem)
    local live0 = tonumber(mem.live_bytes)
    C.tt_alloc_reset_peak(dev)
    ddp:begin_step()
    -- The global batch at this step's data position (past any window the guard skipped;
    -- a loader that reads in order drops the skipped batches).
    local pos = guard:position(step)
    -- (A tetra.data source counts its training batches once its loader exists.)
    local function next_read() return data.next_step and (data.next_step.train or 1) end
    while next_read() and next_read() < pos do
      free(data:batch(next_read(), t.batch_size, seq_len, "train"))
    end
    write_step_inputs()
    local graphed = graphs and step > graphs.warmup
    local global
    if graphed and graphs.input then
      global = upload(data:batch(pos, t.batch_size, seq_len, "train"), graphs.input)
    else
      global = upload(data:batch(pos, t.batch_size, seq_len, "train"))
      if graphed then graphs.input = global end
    end
    local data_wait = metrics.now() - t0
    if trace.on then trace.span("data_wait", t0, t0 + data_wait, { step = step }) end
    local timer = strategy.timer
    timer:reset()
    if graphed then return graph_step(step, pos, t0, wait0, live0, data_wait, global) end
    local mine = data.local_rows and global or ddp:batch_slice(global)
    local fb0 = timer:mark()
    local loss_sum = forward_backward(mine, accum)   -- a device tensor, or a number
    if mine ~= global then free(mine) end
    free(global)
    local fb1 = timer:mark()
    if guard:poisoned(pos) then   -- the test switch: what a diverged step looks like
      if type(loss_sum) == "number" then loss_sum = 0 / 0
      else tffi.check(C.tt_fill_(loss_sum, 0 / 0)) end
      local p = optimizer.params[1]
      local g = p and p._grad
      if g ~= nil then tffi.check(C.tt_fill_(g, 0 / 0)) end
    end
    if on_grads then on_grads(env, step) end
    local opt0, ow0 = timer:mark(), metrics.now()
    local lr = env.schedule(step)
    local opt = env.optimizer
    local loss, bad, skipped, grad_norm, opt1
    if type(loss_sum) ~= "number" and opt.read_stats then
      -- One wait for the device per step: the mean loss over the ranks (dp x cp) joins
      -- the norm and found_inf in the optimizer's stats; fp16's unscale, the clip and the
      -- update are launched (the device skips the update when a gradient, the norm or the
      -- loss is not finite, or the loss is a spike); then the one read, and the verdicts
      -- from what it brought.
      launch_update(loss_sum, lr)
      opt1 = timer:mark()
      skipped, grad_norm, loss = ctx:step_finish(opt)
      bad = guard:judge_loss(loss, opt.last_stats.spike)
      if skipped and not bad and guard.enabled and not ctx.scaler then bad = "nonfinite_grad" end
    else
      if type(loss_sum) ~= "number" then
        local v = F.item(loss_sum)
        free(loss_sum)
        loss_sum = v
      end
      loss = global_mean(loss_sum / accum)
      bad = guard:judge_loss(loss)
      -- fp16: unscale, then check (the verdict agreed over every rank), then clip; the
      -- optimizer steps unless the grads were not finite. Under ZeRO-1
      -- env.optimizer.params are this rank's grad shards: those are the ones unscaled.
      if bad then   -- the update is skipped before any work on the grads
        skipped, grad_norm = true, 0 / 0
        ctx.skipped_steps = ctx.skipped_steps + 1
      else
        skipped, grad_norm = ctx:step(opt.params,
          function() ddp:optimizer_step(opt, lr) end,
          function() return clip(t.max_grad_norm) end, mesh.world, opt)
        -- Non-finite grads outside fp16 (where overflows are the scaler's routine).
        if skipped and guard.enabled and not ctx.scaler then bad = "nonfinite_grad" end
      end
      opt1 = timer:mark()
      timer:wait(opt1)   -- CUDA: the update may still run (a second wait in this step)
    end
    -- compute times, between marks the device has passed (the read waited for them)
    local fb = timer:seconds(fb0, fb1)
    return finish_step({ step = step, pos = pos, t0 = t0, wait0 = wait0, live0 = live0,
                         data_wait = data_wait, lr = lr, loss = loss, bad = bad,
                         skipped = skipped, grad_norm = grad_norm, ow0 = ow0, fb = fb,
                         forward = strategy:forward_seconds(),
                         optimizer_s = timer:seconds(opt0, opt1) })
  end

  -- Mean loss over n_batches held-out global batches (default train.eval_steps), no
  -- tape. Mock and byte data give the same batches at every evaluation; a tetra.data
  -- source reads on through data.val_path.
  function env.evaluate(n_batches)
    n_batches = n_batches or t.eval_steps or 4
    return F.no_grad(function()
      local sum = 0.0
      for i = 1, n_batches do
        local global = to_dev(data:batch(i, t.batch_size, seq_len, "val"), dev)
        local mine = data.local_rows and global or ddp:batch_slice(global)
        sum = sum + strategy:eval_loss(mine)
        if mine ~= global then free(mine) end
        free(global)
      end
      return global_mean(sum / n_batches)
    end)
  end

  -- Bytes of this rank's parameters, gradients and optimizer state.
  env.memory = par:memory(optimizer)

  function env.generate(prompt_ids, gen_opts)
    gen_opts = gen_opts or {}
    gen_opts.seq_len = gen_opts.seq_len or seq_len
    gen_opts.par = par
    return train.generate(model, prompt_ids, gen_opts)
  end

  -- checkpoint.resume: model, optimizer, step, RNG, data and scaler state from a
  -- checkpoint (env.resumed_from names it); the next env.step() continues after it.
  checkpoint.resume(env)
  return env
end

-- -- Generation ------------------------------------------------------------------------

-- Index of one token drawn from logits[0 .. V-1] (a float pointer): temperature 0 is
-- greedy; otherwise softmax(logits / temperature) over the top_k largest (all if nil).
local function sample(logits, V, temperature, top_k)
  local best = 0
  for i = 1, V - 1 do if logits[i] > logits[best] then best = i end end
  if not temperature or temperature <= 0 then return best end
  local idx = {}
  for i = 0, V - 1 do idx[i + 1] = i end
  if top_k and top_k > 0 and top_k < V then
    table.sort(idx, function(a, b) return logits[a] > logits[b] end)
    for i = #idx, top_k + 1, -1 do idx[i] = nil end
  end
  local weights, total = {}, 0.0
  for i, id in ipairs(idx) do
    weights[i] = math.exp((logits[id] - logits[best]) / temperature)
    total = total + weights[i]
  end
  local r = math.random() * total
  for i, id in ipairs(idx) do
    r = r - weights[i]
    if r <= 0 then return id end
  end
  return idx[#idx]
end

-- Continues prompt_ids (array of token ids) by opts.max_new_tokens (64) tokens, feeding
-- the last opts.seq_len tokens each time (no KV cache: models here are small).
-- opts: temperature (0.8), top_k (40), seed (0), seq_len, par (the model's applied
-- parallelism: a tensor-parallel head's logits are gathered). Returns the new ids (array).
function train.generate(model, prompt_ids, opts)
  opts = opts or {}
  local n_new = opts.max_new_tokens or 64
  local seq_len = assert(opts.seq_len, "generate: opts.seq_len is required")
  math.randomseed(opts.seed or 0)
  local first_param = model:parameters()[1]
  local dev = first_param and first_param._device or C.TT_CPU  -- the model's device
  local ids = {}
  for i, id in ipairs(prompt_ids) do ids[i] = id end
  local out = {}
  F.no_grad(function()
    for _ = 1, n_new do
      local first = math.max(1, #ids - seq_len + 1)
      local T = #ids - first + 1
      local x = F.empty({ 1, T }, C.TT_I64)
      local p = ffi.cast("int64_t *", C.tt_tensor_data(x))
      for j = 0, T - 1 do p[j] = ids[first + j] end
      x = to_dev(x, dev)
      local y = model(x)
      if opts.par then                                 -- tensor parallel: gathered
        local full = opts.par:full_logits(y)
        if full ~= y then free(y) end
        y = full
      end
      local logits = to_dev(y, C.TT_CPU)               -- (1, T, V), contiguous
      if logits._dtype ~= C.TT_F32 then                -- a bf16 head's: widened
        local wide = logits:float()
        free(logits)
        logits = wide
      end
      local V = tonumber(logits._shape[2])
      local last = ffi.cast("float *", C.tt_tensor_data(logits)) + (T - 1) * V
      local id = sample(last, V, opts.temperature or 0.8, opts.top_k or 40)
      free(logits); free(x)
      ids[#ids + 1] = id
      out[#out + 1] = id
    end
  end)
  return out
end

-- -- The loop ----------------------------------------------------------------------------

-- Prints a continuation of `prompt` (a string; default train.prompt or a newline) on
-- rank 0, using env.tokenizer (nothing to print without one) and train.sample_tokens,
-- temperature, top_k, seed.
-- A tensor-parallel model generates on every rank (its forward is collective); rank 0
-- prints.
function train.print_sample(env, prompt)
  local t = env.cfg.train
  if not env.tokenizer or (t.sample_tokens or 0) <= 0 then return end
  local par = env.par
  if par.stage or par.sequence then   -- a forward of any length on every stage: not yet
    if env.rank == 0 then
      print("(no sample: generation does not run across pipeline stages or with " ..
            "sequence parallelism yet)")
    end
    return
  end
  if env.rank ~= 0 and par.layout.tp == 1 then return end
  local tok = env.tokenizer
  prompt = prompt or t.prompt or "\n"
  local ids = env.generate(tok:encode(prompt), { max_new_tokens = t.sample_tokens,
    temperature = t.temperature, top_k = t.top_k, seed = t.seed })
  if env.rank ~= 0 then return end
  io.stdout:write("--- sample (", #ids, " tokens, temperature ", tostring(t.temperature),
                  ", top-k ", tostring(t.top_k), ") ---\n", prompt, tok:decode(ids),
                  "\n---\n")
  io.stdout:flush()
end

-- Runs cfg.train.steps optimizer steps. Rank 0 shows progress (log.progress): one
-- updating line on a terminal (not under mpirun), otherwise a plain line every log.every
-- steps; every step goes to log.metrics_file. Eval loss every train.eval_every steps and
-- at the end; a text sample every train.sample_every steps and at the end (when the data
-- has a tokenizer); a closing summary line (steps, time, tokens/s, loss, eval loss,
-- checkpoint). Returns { first_loss, last_loss, eval_loss, records (step, loss,
-- eval_loss, step_time_s, skipped of the last train.records_kept steps), elapsed_s }.
train.records_kept = 1000

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
  return metrics.open_file(path, "a", "log.log_file")
end

-- train.max_bad_steps bad steps in a row (tetra.train.guard): loads the latest checkpoint
-- into env (an in-process resume) and skips the data the bad steps read, so that the
-- run goes on past it. Every rank reaches this together (the guard's verdict is agreed).
function train.roll_back(env, show)
  local guard, cfg = env.guard, env.cfg
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

function train.run(env)
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
    io.stdout:flush()
  end
  -- tetra launch reads the last completed step from this file (rank 0 writes it).
  local status_path = is_main and os.getenv("TETRA_LAUNCH_STATUS")
  local function report_step(step)
    if not status_path or status_path == "" then return end
    local f = io.open(status_path, "w")
    if f then
      f:write("step ", step, "\n")
      f:close()
    end
  end
  report_step(env.step_count)
  local crash_at = t.inject_crash_step or 0
  -- checkpoint.async: saves are written by a thread while the next steps run (the last
  -- one is written before the run returns).
  local async_save = (cfg.checkpoint or {}).async == true
  local checkpoint_s = 0   -- the loop's time on checkpoints since the previous record
  while env.step_count < total do
    local step = env.step_count + 1
    if crash_at > 0 and step == crash_at then
      user_error(string.format("train.inject_crash_step: failing at step %d on purpose " ..
                               "(a test switch; unset it to train)", step))
    end
    local r = env.step()
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
    if #records >= train.records_kept then table.remove(records, 1) end
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
      rank_log:write(os.date("!%Y-%m-%dT%H:%M:%SZ "), "rank ", env.rank, " | ", line, "\n")
      rank_log:flush()
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
    report_step(step)
    -- The record is on disk before the save: a run killed during the save resumes from an
    -- earlier checkpoint and keeps that checkpoint's records, so no step's record is
    -- lost. The save's time goes in the next record (checkpoint_s). A step that rolls
    -- back saves nothing.
    if r.roll_back then
      checkpoint.drain(env)
      train.roll_back(env, show)
    else
      local c0 = metrics.now()
      local due = checkpoint.due(cfg, step, total)
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
    if sample_every > 0 and step % sample_every == 0 and step ~= total then
      train.print_sample(env)
    end
  end
  writer:close()
  train.print_sample(env)
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
      rank_log:write(os.date("!%Y-%m-%dT%H:%M:%SZ "), "rank ", env.rank, " | ", line, "\n")
    end
  end
  if rank_log then rank_log:close() end
  return { first_loss = summary.first_loss, last_loss = last and last.loss,
           eval_loss = last and last.eval_loss, records = records,
           elapsed_s = metrics.now() - started }
end

-- -- Recipes -----------------------------------------------------------------------------

-- The recipe table for a model class (see recipes/llama.lua): setup(cfg) builds the data
-- source, seeds the RNG (so the initial weights depend on the seed only), builds
-- spec.Model(cfg.model) whole and the training state, which applies spec.plan (the
-- model's parallel plan, recipes/NAME/plan.lua) for the layout; run(cfg) reports the model's
-- size and this rank's memory on rank 0 and trains. setup(cfg, extra): extra's fields
-- join train.setup's opts (tests: graph_check, on_grads).
function train.recipe(spec)
  local recipe = { name = spec.name, Model = spec.Model, plan = spec.plan,
                   defaults = spec.defaults }
  function recipe.setup(cfg, extra)
    local data, tokenizer = train.data_source(cfg)
    checkpoint.precheck(cfg)   -- a missing or corrupt checkpoint: before the model
    C.tt_manual_seed(cfg.train.seed or 0)
    local source = cfg.model.init_from
    local hf = source and require("tetra.checkpoint.hf")
    local family = hf and hf.family_of(spec.Model)
    if family and cfg.model.family and family ~= cfg.model.family then
      user_error(string.format("model.init_from=%s holds a %s model but recipe %s builds " ..
        "a %s: run recipes/%s/model.lua", source, cfg.model.family, spec.name, family,
        cfg.model.family))
    end
    local model = spec.Model(cfg.model)
    if source then hf.init_weights(model, source) end   -- before the plan splits it
    local opts = { tokenizer = tokenizer, plan = spec.plan }
    for k, v in pairs(extra or {}) do opts[k] = v end
    return train.setup(cfg, model, data, opts)
  end
  function recipe.run(cfg)
    local env = recipe.setup(cfg)
    if env.rank == 0 then
      local m, mem = cfg.model, env.memory
      local split = env.mesh.size > 1 and " on this rank" or ""
      print(string.format("%s: %.2fM parameters%s, %d layers, dim %d, seq %d, batch %d",
        spec.name, env.model:num_params() / 1e6, split, m.n_layers, m.dim, m.seq_len,
        cfg.train.batch_size))
      print(string.format("memory%s: parameters %.2f MB, gradients %.2f MB, optimizer " ..
        "state %.2f MB", split, mem.params / 1e6, mem.grads / 1e6, mem.optimizer / 1e6))
      local d = cfg.data or {}
      print(d.mock and "data: mock tokens (uniform random; data.mock=true), not text" or
            "data: " .. tostring(type(d.input_path) == "table" and
                                 table.concat(d.input_path, ",") or d.input_path or
                                 "data.datasets"))
      local held = (cfg.train.eval_every or 0) > 0 and require("tetra.data").holdout(cfg)
      if held then
        print(string.format("eval: the last %g%% of each training source, held out " ..
                            "(data.eval_fraction; data.eval_path names other data)", held * 100))
      end
    end
    return train.run(env)
  end
  return recipe
end

return train
