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
-- global batch. train.mock_data and tetra.bytetok.dataset are two such sources. A source
-- with `local_rows` set (tetra.data's) returns this data-parallel rank's rows of the
-- global batch instead, and reads and tokenizes only those.
local ffi = require("ffi")
local C = require("tetra.ffi").C
local F = require("tetra.nn.functional")
local optim = require("tetra.optim")
local metrics = require("tetra.metrics")
local amp = require("tetra.amp")
local checkpoint = require("tetra.checkpoint")
local tffi = require("tetra.ffi")

local train = {}

local free = F.free

-- A user-facing error: the tetra binary prints the message alone, without a traceback.
local function user_error(msg)
  error(setmetatable({ message = msg, user = true },
                     { __tostring = function(e) return e.message end }), 0)
end

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
    local bytetok = require("tetra.bytetok")
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

-- The engine device id for train.device: C.TT_CPU for "cpu" (or nil); for "cuda" /
-- "cuda:N" starts the CUDA backend (tt_cuda_init picks this rank's GPU; "cuda:N" then
-- selects N). Raises "no CUDA device: ..." when the binary has no CUDA or finds no GPU.
function train.device(name)
  if name == nil or name == "cpu" then return C.TT_CPU end
  local n = name == "cuda" and -1 or tonumber(tostring(name):match("^cuda:(%d+)$"))
  if not n then
    user_error("train.device: unknown device '" .. tostring(name) .. "' (cpu, cuda or cuda:N)")
  end
  if not (pcall(tffi.cdef_header, "tetra_cuda.h") and tffi.has_symbol("tt_cuda_init")) then
    user_error("no CUDA device: this tetra was built without CUDA (train.device=" ..
               name .. "; rebuild with -DTETRA_CUDA=ON or use train.device=cpu)")
  end
  if C.tt_cuda_init() ~= 0 then user_error(ffi.string(C.tt_last_error())) end
  if n >= 0 and C.tt_cuda_set_device(n) ~= 0 then user_error(ffi.string(C.tt_last_error())) end
  return C.tt_cuda_current_device()
end

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

-- -- Setup -------------------------------------------------------------------------------

-- Builds the training environment: env.model, env.optimizer, env.data, env.cfg, env.mesh,
-- env.ddp, env.schedule, env.amp (the tetra.amp context of train.precision), env.device
-- (the engine device id of train.device), env.step() (one optimizer step, returns its
-- metrics record), env.evaluate([n_batches]) and env.generate(prompt_ids, opts).
-- The model (built whole, on the CPU) is split for the layout, wrapped for the precision
-- and moved to train.device here; env.par is tetra.parallel.apply's result.
-- opts: plan (the model's parallel plan, recipes/plans/; needed for tensor, context or
-- pipeline parallelism), tokenizer (tok:encode(text), tok:decode(ids); for samples),
-- on_grads(env, step) (see env.step).
-- Metrics record of a step: step, loss, lr, grad_norm (before clipping; nil on a skipped
-- step), tokens, tokens_per_s, step_time_s, data_wait_s, exposed_comm_s (seconds blocked
-- on communication: what computation did not hide, pipeline bubbles included),
-- loss_scale (the fp16 scale after this step's update; 1 in other precisions), skipped
-- (true when inf/NaN grads skipped the optimizer step); this rank's param_bytes,
-- grad_bytes, optimizer_bytes, peak_bytes (the allocator's high-water mark during the
-- step) and step_peak_bytes (how far the step rose above what it started with:
-- activations, gradients, communication buffers).
function train.setup(cfg, model, data, opts)
  opts = opts or {}
  local t, o = cfg.train, cfg.optim or {}
  if t.threads and t.threads > 0 then C.tt_set_num_threads(t.threads) end
  local parallel = require("tetra.parallel")
  -- A config built in code has not met tetra.config's checks: the layout's are cheap.
  require("tetra.parallel.layout").check(cfg, require("tetra.config").world_size())
  local lay = parallel.layout(cfg)
  local dist = require("tetra.dist")
  local mesh = dist.init(cfg)
  if (lay.tp > 1 or lay.cp > 1 or lay.pp > 1) and not opts.plan then
    dist.fail("this model has no parallel plan, so it runs with data parallelism only: " ..
              "set parallel.tensor/context/pipeline_parallel_size to 1, or give " ..
              "train.setup a plan (recipes/plans/llama.lua is one)")
  end
  local par = parallel.apply(model, opts.plan, mesh, cfg)
  -- The whole model was built on every rank and apply kept this rank's slices: the rest
  -- is garbage the Lua GC may not visit for a long time (it sees small handles, not the
  -- bytes behind them). Collected now, it stops counting in every step's memory.
  collectgarbage()
  local ctx = amp.wrap(model, cfg)
  local dev = train.device(t.device)
  if dev ~= C.TT_CPU then train.to_device(model, dev) end
  par.device = dev
  local params, tensors = {}, {}
  for i, e in ipairs(par:placements()) do params[i], tensors[i] = { e.name, e.tensor }, e.tensor end
  local ddp = parallel.data.wrap(tensors, mesh, cfg)
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
  if par:global_norm() or shards then
    clip = function(max_norm) return par:clip_grad_norm(optimizer, max_norm, shards) end
  else
    clip = function(max_norm) return optimizer:clip_grad_norm(max_norm) end
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

  local mem = ffi.new("tt_alloc_stats")
  function env.step()
    local step = env.step_count + 1
    local t0, wait0 = metrics.now(), C.tt_dist_wait_seconds()
    C.tt_alloc_stats_get(dev, mem)
    local live0 = tonumber(mem.live_bytes)
    C.tt_alloc_reset_peak(dev)
    ddp:begin_step()
    local global = to_dev(data:batch(step, t.batch_size, seq_len, "train"), dev)
    local mine = data.local_rows and global or ddp:batch_slice(global)
    local data_wait = metrics.now() - t0
    local loss_sum = strategy:forward_backward(mine, accum)
    if mine ~= global then free(mine) end
    free(global)
    if on_grads then on_grads(env, step) end
    -- fp16: unscale, then check (the verdict agreed over every rank), then clip; the
    -- optimizer steps unless the grads were not finite. Under ZeRO-1
    -- env.optimizer.params are this rank's grad shards: those are the ones unscaled.
    local lr = env.schedule(step)
    local opt = env.optimizer
    local skipped, grad_norm = ctx:step(opt.params,
      function() ddp:optimizer_step(opt, lr) end,
      function() return clip(t.max_grad_norm) end, mesh.world)
    C.tt_alloc_stats_get(dev, mem)
    local peak = tonumber(mem.peak_bytes)
    model:zero_grad()
    C.tt_tape_clear()   -- drops any recorded branch no backward reached
    if dev ~= C.TT_CPU then tffi.check(C.tt_cuda_synchronize()) end  -- the step's real time
    env.step_count = step
    local tokens = t.batch_size * seq_len
    env.tokens_seen = env.tokens_seen + tokens
    local dt = metrics.now() - t0
    local r = { step = step, loss = global_mean(loss_sum / accum), lr = lr,
                grad_norm = grad_norm, tokens = env.tokens_seen, tokens_per_s = tokens / dt,
                step_time_s = dt, data_wait_s = data_wait,
                exposed_comm_s = C.tt_dist_wait_seconds() - wait0,
                param_bytes = env.memory.params, grad_bytes = env.memory.grads,
                optimizer_bytes = env.memory.optimizer, peak_bytes = peak,
                step_peak_bytes = peak - live0,
                loss_scale = ctx:scale(), skipped = skipped }
    if data.stats then   -- tetra.data's loader reports its own throughput and queue
      local s = data:stats()
      r.loader_tokens_per_s, r.loader_queue_depth = s.tokens_per_s, s.queue_depth
    end
    return r
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
  for step = env.step_count + 1, total do
    local r = env.step()
    -- The first steps pay for warm-up (allocator, page faults): a moving average of the
    -- step time gives a steadier ETA.
    avg_step = avg_step and (0.9 * avg_step + 0.1 * r.step_time_s) or r.step_time_s
    if eval_every > 0 and (step % eval_every == 0 or step == total) then
      r.eval_loss = env.evaluate()
    end
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
        line = line .. " | SKIPPED: inf/NaN grads" ..
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
    if checkpoint.due(cfg, step, total) then summary.checkpoint = checkpoint.save(env) end
    if sample_every > 0 and step % sample_every == 0 and step ~= total then
      train.print_sample(env)
    end
  end
  writer:close()
  train.print_sample(env)
  local last = records[#records]
  if summary.steps > 0 and (show or rank_log) then
    local line = string.format("done: %d steps in %.1f s, %.0f tokens/s, loss %.4f -> %.4f",
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
-- model's parallel plan, recipes/plans/) for the layout; run(cfg) reports the model's
-- size and this rank's memory on rank 0 and trains.
function train.recipe(spec)
  local recipe = { name = spec.name, Model = spec.Model, plan = spec.plan,
                   defaults = spec.defaults }
  function recipe.setup(cfg)
    local data, tokenizer = train.data_source(cfg)
    checkpoint.precheck(cfg)   -- a missing or corrupt checkpoint: before the model
    C.tt_manual_seed(cfg.train.seed or 0)
    local model = spec.Model(cfg.model)
    return train.setup(cfg, model, data, { tokenizer = tokenizer, plan = spec.plan })
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
