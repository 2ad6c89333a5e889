-- tetra.train.setup: the training environment `env`, the one table every step reads and
-- writes (tetra.train.step), built in this order: the layout's parallelism applied to
-- the model (tetra.parallel.apply, from the recipe's plan), the precision (tetra.optim.amp),
-- activation recompute (tetra.nn.recompute), the device, telemetry, the optimizer and its
-- data-parallel wrapper, the step strategy, the loss guard, CUDA graphs, then a
-- checkpoint's state when resuming.
local ffi = require("ffi")
local tffi = require("tetra.ffi")
local C = tffi.C
local F = require("tetra.nn.functional")
local optim = require("tetra.optim")
local amp = require("tetra.optim.amp")
local checkpoint = require("tetra.checkpoint")
local telemetry = require("tetra.obs.telemetry")
local mfu = require("tetra.obs.mfu")
local trace = require("tetra.obs.trace")
local device = require("tetra.train.device")
local step = require("tetra.train.step")
local generate = require("tetra.train.generate")

local free = F.free

-- The optimizer of optim.name (AdamW unless "sgd") over params ({ name, tensor } pairs).
local function make_optimizer(params, t, o)
  if o.name == "sgd" then
    return optim.SGD(params, { lr = t.lr, momentum = o.momentum, weight_decay = t.weight_decay })
  end
  return optim.AdamW(params, { lr = t.lr, beta1 = o.beta1, beta2 = o.beta2, eps = o.eps,
                               weight_decay = t.weight_decay })
end

-- Optimizer offload where the optimizer updates whole weights (not ZeRO's shards): the
-- host update overlaps the next step's forward block by block (AdamW:overlap_with). The
-- plan's blocks (plan.pipeline.blocks) number the weights: those before the first block
-- land before the step's forward (arrive(0), tetra.train.step), each block's before its
-- forward, those after the last block after that block's forward. Without a blocks list
-- every weight lands before the forward.
local function overlap_update(opt, model, plan)
  local T = require("tetra.tensor")
  local whole = {}
  for _, p in ipairs(model:parameters()) do whole[T.key(p)] = true end
  for _, p in ipairs(opt.params) do
    if not whole[T.key(p)] then return end   -- shards: their gathers follow the update
  end
  local blocks, block_of = require("tetra.parallel.data").blocks(model, plan)
  blocks, block_of = blocks or {}, block_of or {}
  local n = #blocks
  local seen_block = false
  for _, p in ipairs(opt.params) do   -- after the last block: n + 1
    local key = T.key(p)
    if block_of[key] then seen_block = true
    elseif seen_block then block_of[key] = n + 1 end
  end
  opt:overlap_with(block_of)
  for j, block in ipairs(blocks) do
    local run = block.forward
    local after = j == n and n + 1 or nil
    rawset(block, "forward", function(mod, ...)
      opt:arrive(j)
      local y = { run(mod, ...) }
      if after then opt:arrive(after) end
      return unpack(y, 1, table.maxn(y))
    end)
  end
end

-- Builds env for cfg, the model (built whole, on the CPU, by the recipe; its randn
-- weights lazy, drawn here only where this rank keeps them) and the data
-- source; see tetra.train.setup for what env holds and opts takes.
return function(cfg, model, data, opts)
  opts = opts or {}
  local t, o = cfg.train, cfg.optim or {}
  if t.threads and t.threads > 0 then C.tt_set_num_threads(t.threads) end
  local parallel = require("tetra.parallel")
  -- A config built in code has not met tetra.config's checks: the layout's are cheap, and
  -- so are the refusals of what a captured step cannot hold.
  require("tetra.config").check_layout(cfg, require("tetra.config").world_size())
  if t.cuda_graphs then require("tetra.config").run_check("cuda_graphs", cfg) end
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

  -- Precision. FP8 layers agree their amaxes over every rank that runs them (the stage's
  -- tp x cp x dp ranks), so that the scales are those of one process on the whole batch.
  local amax_group
  if t.precision == "fp8" and lay.tp * lay.cp * lay.dp > 1 then
    amax_group = lay.pp == 1 and mesh.world or
                 mesh.world:split(mesh.coords.pp, mesh.rank, "fp8 amax (tp x cp x dp)")
  end
  local ctx = amp.wrap(model, cfg, { amax_group = amax_group, partial = lay.pp > 1,
                                     fail = dist.fail })
  -- Activation recompute (train.recompute): the plan's blocks checkpointed around
  -- whatever forward the layout and the precision gave them (tetra.nn.recompute).
  local ok, err = pcall(require("tetra.nn.recompute").apply, model, opts.plan, t)
  if not ok then dist.fail(tostring(err)) end

  -- Device.
  local dev = device.id(t.device)
  if t.cuda_graphs and dev ~= C.TT_CPU then device.use_own_stream() end
  local always = os.getenv("TETRA_TEST_MOVE_MODEL") == "1"
  if dev ~= C.TT_CPU or always then device.move_model(model, dev, always) end
  par.device = dev
  local peak_tflops = mfu.peak_tflops(cfg, mfu.device_name(dev))
  if not peak_tflops and dev ~= C.TT_CPU and mesh.rank == 0 then
    print(string.format("mfu: no peak known for %s (%s); set train.peak_tflops to report MFU",
                        mfu.device_name(dev), t.precision or "fp32"))
  end
  telemetry.start(cfg, mesh, dev ~= C.TT_CPU and dev or nil)
  trace.setup(cfg, mesh)

  -- Optimizer, data parallelism (ZeRO-1 keeps this rank's optimizer shard only, ZeRO-2
  -- its gradient shard too), strategy.
  local params = {}
  for i, e in ipairs(par:placements()) do params[i] = { e.name, e.tensor } end
  local wrapped, ddp = pcall(parallel.data.wrap, par:placements(), mesh, cfg, par.model, opts.plan)
  if not wrapped then dist.fail(tostring(ddp)) end
  local optimizer = make_optimizer(params, t, o)
  ddp:attach_optimizer(optimizer)
  if ddp.sharded_blocks and mesh.rank == 0 then
    local m = par:memory({}, ddp)
    print(string.format("zero-3: %d blocks gathered one at a time over %d ranks; parameters " ..
                        "held by rank 0: %.1f MB (whole: %.1f MB)", ddp.sharded_blocks,
                        ddp.group.size, m.params / 1e6, par:memory({}).params / 1e6))
  end
  -- parallel.offload_optimizer: the moments (this rank's shards under ZeRO) to the host.
  -- (lua/tetra/config/schema/offload.lua refused sgd and CUDA graphs with it.)
  if (cfg.parallel or {}).offload_optimizer then
    optimizer:offload_state()
    -- Under bf16 / fp16 the f32 masters go to the host too: of the weights that only the
    -- GEMMs read, whole or (ZeRO-1 and 2) this rank's shares; under ZeRO-3 every share
    -- of this rank's, the blocks' gathers sending compute-dtype copies of them
    -- (ddp:master_shares).
    local lowp = t.precision == "bf16" and C.TT_BF16 or t.precision == "fp16" and C.TT_F16
    if lowp then
      optimizer:masters_on_host(amp.gemm_only_weights(par.model or model), lowp,
                                ddp:master_shares())
    end
    overlap_update(optimizer, par.model or model, opts.plan)
  end
  -- The recipe's randn and rand parameters are drawn lazily, and the optimizer's state
  -- is lazy zeros (tetra.h): apply's slices and ZeRO-3's shares drew only this rank's
  -- elements, ZeRO's whole moments were never allocated, and what the rank keeps is
  -- drawn now. A rank never holds the whole model (280 GB in f32 for 70B, on every
  -- rank), and a lack of memory stops the set-up here, with one line.
  local function materialize(t, what)
    if C.tt_tensor_materialize(t) ~= 0 then
      dist.fail(string.format("cannot hold %s (%s): %s", what, table.concat(t:shape(), " x "),
                              ffi.string(C.tt_last_error())))
    end
  end
  for _, e in ipairs(par:placements()) do materialize(e.tensor, "parameter " .. e.name) end
  for _, list in ipairs({ optimizer.m or {}, optimizer.v or {}, optimizer.buffers or {} }) do
    for i, t in ipairs(list) do
      materialize(t, "the optimizer state of " .. tostring(optimizer.names and
                                                          optimizer.names[i] or i))
    end
  end
  local pstep = require("tetra.parallel.step")
  local env = {
    cfg = cfg, model = model, data = data, mesh = mesh, ddp = ddp, optimizer = optimizer,
    par = par, tokenizer = opts.tokenizer, rank = mesh.rank or 0, amp = ctx, device = dev,
    schedule = optim.schedule({ lr = t.lr, min_lr = t.min_lr, warmup_steps = t.warmup_steps,
                                steps = t.steps, schedule = t.lr_schedule,
                                decay_steps = t.lr_decay_steps, decay_shape = t.lr_decay_shape }),
    step_count = 0, tokens_seen = 0,
    strategy = pstep.new(par, ddp, ctx, cfg),
    accum = t.gradient_accumulation_steps or 1,
    seq_len = cfg.model.seq_len,
    -- The norm of the whole model: local unless some parameters are split or sharded.
    split_norm = (par:global_norm() or ddp.shards) and true or false,
    -- opts.on_grads(env, step), when given, runs once the grads are complete (after the
    -- data-parallel averaging, before unscaling and clipping): tests inject overflows.
    on_grads = opts.on_grads,
    -- On CUDA, ids and targets are checked on the device (tetra.train.step), reported by
    -- the optimizer's one read of its stats (SGD has none: checked at once there).
    deferred_checks = dev ~= C.TT_CPU and optimizer.read_stats ~= nil,
    -- tetra launch's restart count (0 outside it), for the metrics records.
    restarts = tonumber(os.getenv("TETRA_RESTART_COUNT") or "") or 0,
    flops_per_token = flops_per_token, peak_tflops = peak_tflops,
    mem = ffi.new("tt_alloc_stats"), upload = device.uploader(dev),
    null_timer = require("tetra.obs.timer").null(),
    -- The loss guard (tetra.train.guard): a bad step skips the update; train.max_bad_steps
    -- of them in a row roll back (tetra.train.loop).
    guard = require("tetra.train.guard").new(cfg),
    -- log.op_profile_step: that step runs under the op profile (tetra.train.step)
    op_profile_step = (cfg.log or {}).op_profile_step,
  }
  -- fp16 with AdamW: the loss scale is written into the optimizer's stats before each
  -- step and read there on the device (the backward's seed, the unscale).
  if ctx.scaler and optimizer.stats_tensor then ctx:use_stats_scale(optimizer:stats_tensor()) end

  -- train.cuda_graphs: after `warmup` eager steps of this process (the allocator's cache
  -- grown; the bf16 copies, cuBLASLt and cuDNN handles, workspaces and plans made, which
  -- a capture may not make: a resumed run warms up again), the next step's forward,
  -- backward and update are captured into one CUDA graph (tetra.train.graph) reading the
  -- batch from a static input tensor, and every step from then on copies its batch there,
  -- writes its learning rate and bias corrections into the optimizer's stats
  -- (AdamW:set_update) and replays the graph: no Lua and no launch per kernel, and still
  -- one read per step. opts.graph_check runs the same steps on the CPU in
  -- tetra.train.graph's check mode (tests).
  if t.cuda_graphs or opts.graph_check then
    env.graphs = { warmup = 2, eager = 0, check = opts.graph_check and true or false }
  end
  -- Drops the captured step (the next step captures again): after anything that moves or
  -- replaces tensors the graph reads (a roll-back, a checkpoint load).
  function env.drop_graph()
    local graphs = env.graphs
    if graphs and graphs.graph then
      graphs.graph:close()
      graphs.graph = nil
      if graphs.input then free(graphs.input) end
      graphs.input = nil
      env.optimizer.external_update = nil
    end
  end

  function env.step() return step.run(env) end
  function env.evaluate(n_batches) return step.evaluate(env, n_batches) end

  -- Bytes of this rank's parameters, gradients and optimizer state.
  env.memory = par:memory(optimizer, ddp)

  function env.generate(prompt_ids, gen_opts)
    gen_opts = gen_opts or {}
    gen_opts.seq_len = gen_opts.seq_len or env.seq_len
    gen_opts.par = par
    gen_opts.pipe = env.strategy.pipe   -- the pipeline runner, under pipeline parallelism
    gen_opts.row_multiple = gen_opts.row_multiple or generate.row_multiple(cfg)
    if optimizer.whole_masters then optimizer:whole_masters() end   -- see step.evaluate
    return generate.generate(model, prompt_ids, gen_opts)
  end

  -- model.init_from a Tetra checkpoint (opts.init_from), or a Hugging Face folder
  -- (opts.init_index its tensors): this rank's part of every parameter read from it, in
  -- whatever layout wrote it; the optimizer starts fresh.
  if opts.init_from then checkpoint.init_weights(env, opts.init_from, opts.init_index) end
  -- checkpoint.resume: model, optimizer, step, RNG, data and scaler state from a
  -- checkpoint (env.resumed_from names it); the next env.step() continues after it.
  checkpoint.resume(env)
  return env
end
