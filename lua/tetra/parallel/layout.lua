-- tetra.parallel.layout: every rule about the parallel layout, in one place (the role of
-- torchtitan's ParallelDims): the sizes a config gives, and the rules they must keep.
-- tetra.config runs the rules while it validates a config, before a model is built or
-- anything large allocated; each broken rule is one line naming the keys, their values
-- and the fix. It requires nothing: the config, the mesh (tetra.dist), the parallel
-- dimensions, the planner and the tools all read the layout here.
--
--   layout.sizes(cfg)                -- { tp, cp, dp, pp, world, virtual, ... }
--   layout.problems(cfg, world_size) -- every problem, as an array of lines
--   layout.step_kernels(cfg)         -- the kernel families a step dispatches, and dtypes
--   layout.device_problem(cfg)       -- the line refusing a step with no CUDA kernel, or nil
--   layout.row_multiple(cfg)         -- the multiple a forward's rows must come in
local M = {}

-- The config key of each dimension's size (parallel.<key>).
M.size_keys = { tp = "tensor_parallel_size", cp = "context_parallel_size",
                dp = "data_parallel_size", pp = "pipeline_parallel_size" }

-- The layout's sizes from cfg.parallel and cfg.train, 1 where a key is unset:
--   tp, cp, dp, pp   the four dimensions; world = tp x cp x dp x pp, the processes they need
--   virtual          model chunks per pipeline stage (parallel.virtual_pipeline_size)
--   micro_batches    micro-batches per step (train.gradient_accumulation_steps)
--   micro_batch      sequences of one micro-batch on one data-parallel rank:
--                    train.batch_size / (dp x micro_batches); nil without train.batch_size
function M.sizes(cfg)
  local p, t = (cfg and cfg.parallel) or {}, (cfg and cfg.train) or {}
  local s = {}
  for dim, key in pairs(M.size_keys) do s[dim] = p[key] or 1 end
  s.world = s.tp * s.cp * s.dp * s.pp
  s.virtual = p.virtual_pipeline_size or 1
  s.micro_batches = t.gradient_accumulation_steps or 1
  s.micro_batch = t.batch_size and t.batch_size / (s.dp * s.micro_batches)
  return s
end

-- Appends the problem `fmt, ...` to list.
local function add(list, fmt, ...) list[#list + 1] = string.format(fmt, ...) end

-- The rules of the mesh itself: its size and order, the batch split.
local function mesh_rules(cfg, s, world, out)
  local p, t = cfg.parallel or {}, cfg.train
  local tp, cp, dp, pp, need = s.tp, s.cp, s.dp, s.pp, s.world
  if world and world ~= need then
    add(out, "this layout needs %d processes (data %d x tensor %d x pipeline %d x context %d) " ..
        "but %d %s running: run it with `mpirun -np %d tetra run ...`, or change " ..
        "parallel.*_parallel_size so that their product is %d",
        need, dp, tp, pp, cp, world, world == 1 and "is" or "are", need, world)
  end
  local dims = {}
  for d in (p.order or "tp-cp-dp-pp"):gmatch("[^-]+") do dims[#dims + 1] = d end
  table.sort(dims)
  if table.concat(dims, "-") ~= "cp-dp-pp-tp" then
    add(out, "parallel.order must name tp, cp, dp and pp once each (e.g. 'tp-cp-dp-pp'), got '%s'",
        tostring(p.order))
  end
  if (p.zero_stage or 0) > 3 then
    add(out, "parallel.zero_stage = %d is not a stage: use 0, 1 (AdamW state sharded), " ..
        "2 (gradients too) or 3 (parameters too)", p.zero_stage)
  end
  -- ZeRO shards AdamW's moments (and the parameters' update); SGD's momentum buffers are
  -- kept whole per parameter, which the shards' update cannot index.
  if (p.zero_stage or 0) >= 1 and (cfg.optim or {}).name == "sgd" then
    add(out, "parallel.zero_stage = %d shards AdamW's state, and optim.name=sgd keeps none " ..
        "in shards: set optim.name=adamw or parallel.zero_stage=0", p.zero_stage)
  end
  -- ZeRO-3 gathers parameters into memory it gives back between uses: a captured CUDA
  -- graph would replay on freed addresses, the offloaded update and the row-sparse
  -- embedding bucket expect whole parameters and size-planned buckets.
  if p.zero_stage == 3 then
    local d = cfg.dist or {}
    if t.cuda_graphs then
      add(out, "parallel.zero_stage = 3 frees each block's parameters between uses, which " ..
          "a CUDA graph cannot replay: set train.cuda_graphs=false or parallel.zero_stage <= 2")
    end
    if d.sparse_embedding_grad then
      add(out, "parallel.zero_stage = 3 reduces the embedding with its unit: set " ..
          "dist.sparse_embedding_grad=false or parallel.zero_stage <= 2")
    end
  end
  local accum = s.micro_batches
  if t.batch_size % (accum * dp) ~= 0 then
    add(out, "train.batch_size (%d) must be a multiple of train.gradient_accumulation_steps x " ..
        "parallel.data_parallel_size (%d x %d = %d)", t.batch_size, accum, dp, accum * dp)
  end
end

-- Tensor and sequence parallelism: what the model's sizes must allow.
local function tensor_rules(cfg, s, out)
  local m, p = cfg.model or {}, cfg.parallel or {}
  local tp, cp = s.tp, s.cp
  if p.sequence_parallel and tp == 1 then
    add(out, "parallel.sequence_parallel=true needs parallel.tensor_parallel_size > 1 " ..
        "(it splits the sequence over the tensor-parallel ranks)")
  end
  if tp == 1 then return end
  local function divides(key, why)
    local v = m[key]
    if v and v % tp ~= 0 then
      add(out, "parallel.tensor_parallel_size (%d) must divide model.%s (%d)%s", tp, key, v, why)
    end
  end
  divides("n_heads", " for tensor parallelism (attention heads are split)")
  local kv = m.n_kv_heads
  if kv and kv < tp and tp % kv ~= 0 then
    add(out, "parallel.tensor_parallel_size (%d) must be a multiple of model.n_kv_heads (%d) " ..
        "when there are fewer key/value heads than tensor-parallel ranks (each head is " ..
        "held by tp / n_kv_heads ranks)", tp, kv)
  elseif kv and kv >= tp then
    divides("n_kv_heads", " for tensor parallelism (key/value heads are split)")
  end
  divides("ffn_hidden", " for tensor parallelism (MLP hidden units are split)")
  -- The vocabulary splits in parts of ceil(V / tp) rows: every rank needs one.
  local V = m.vocab_size
  if V and (tp - 1) * math.ceil(V / tp) >= V then
    add(out, "model.vocab_size (%d) is too small for parallel.tensor_parallel_size (%d): " ..
        "split in parts of %d rows, the last rank would hold none", V, tp, math.ceil(V / tp))
  end
  if p.sequence_parallel and m.seq_len and (m.seq_len / cp) % tp ~= 0 then
    add(out, "model.seq_len (%d) / parallel.context_parallel_size (%d) must be a multiple of " ..
        "parallel.tensor_parallel_size (%d) with sequence parallelism", m.seq_len, cp, tp)
  end
end

local function context_rules(cfg, s, out)
  local m, cp = cfg.model or {}, s.cp
  if cp > 1 and m.seq_len and m.seq_len % (2 * cp) ~= 0 then
    add(out, "model.seq_len (%d) must be a multiple of 2 x parallel.context_parallel_size (%d)",
        m.seq_len, 2 * cp)
  end
end

local function pipeline_rules(cfg, s, out)
  local m, p = cfg.model or {}, cfg.parallel or {}
  local pp, v = s.pp, s.virtual
  local schedule = p.pipeline_schedule or "1f1b"
  if schedule == "interleaved_1f1b" then
    if v < 2 then
      add(out, "parallel.pipeline_schedule=interleaved_1f1b needs parallel.virtual_pipeline_size " ..
          ">= 2 (model chunks per stage)")
    end
    local micro = s.micro_batches
    if pp > 1 and micro % pp ~= 0 then
      add(out, "parallel.pipeline_schedule=interleaved_1f1b: train.gradient_accumulation_steps " ..
          "(%d, the micro-batches) must be a multiple of parallel.pipeline_parallel_size (%d)",
          micro, pp)
    end
  elseif v > 1 then
    add(out, "parallel.virtual_pipeline_size=%d needs parallel.pipeline_schedule=interleaved_1f1b " ..
        "(%s runs one model chunk per stage)", v, schedule)
  end
  local stages = pp * v
  if m.n_layers and m.n_layers < stages then
    add(out, "model.n_layers (%d) must be at least parallel.pipeline_parallel_size x " ..
        "virtual_pipeline_size (%d): every stage needs a block", m.n_layers, stages)
  end
  if p.pipeline_stages then
    if #p.pipeline_stages ~= stages then
      add(out, "parallel.pipeline_stages has %d entries, expected one per stage (%d)",
          #p.pipeline_stages, stages)
    end
    local sum = 0
    for i, n in ipairs(p.pipeline_stages) do
      sum = sum + n
      if n < 1 then add(out, "parallel.pipeline_stages[%d] is %d: every stage needs a block", i, n) end
    end
    if m.n_layers and sum ~= m.n_layers then
      add(out, "parallel.pipeline_stages adds up to %d layers, model.n_layers is %d", sum, m.n_layers)
    end
  end
end

-- -- Device support ----------------------------------------------------------------------

-- The kernel families with a CUDA implementation (kernels/cuda/<family>.cu and the
-- engine's own CUDA files, each named in engine/cuda/kernels_linked.cu), with the dtypes
-- of the activations or logits each takes there; true: every float dtype the step gives
-- it. tests/lua/layout_spec.lua checks this table against those sources, so a family
-- whose CUDA file goes away fails there, and every row of tests/dist/layouts.txt on cuda.
M.cuda_kernels = {
  elementwise = true, activation = true, reduce = true, matmul = true, embedding = true,
  norm = true, rope = true, attention = true, optim = true, fused = true, cast = true,
  matmul_lowp = true, fp8_linear = true, copy = true,
  loss = { f32 = true, bf16 = true },
  vocab_parallel = { f32 = true, bf16 = true },
}

-- The kernel families one training step of cfg dispatches, each { family, dtype, why }:
-- dtype is that of the activations or logits it gets (bf16 precision keeps the
-- activations between GEMMs, the logits among them, in bf16; the others f32).
function M.step_kernels(cfg)
  local t, s = (cfg and cfg.train) or {}, M.sizes(cfg)
  local precision = t.precision or "fp32"
  local act = precision == "bf16" and "bf16" or "f32"
  local out = {}
  local function use(family, why) out[#out + 1] = { family = family, dtype = act, why = why } end
  for _, f in ipairs({ "embedding", "matmul", "norm", "rope", "attention", "activation",
                       "elementwise", "reduce", "fused", "optim", "cast", "copy" }) do
    use(f, "every step")
  end
  if s.tp > 1 then
    use("vocab_parallel", string.format("the loss under parallel.tensor_parallel_size=%d", s.tp))
  else
    use("loss", "the loss")
  end
  if precision == "bf16" or precision == "fp16" then
    use("matmul_lowp", "train.precision=" .. precision)
  end
  if precision == "fp8" then use("fp8_linear", "train.precision=fp8") end
  return out
end

-- The one line refusing cfg's step on its device, or nil: a step on a GPU needs a CUDA
-- kernel for every family it dispatches, for the dtype it gets.
function M.device_problem(cfg)
  local device = cfg and cfg.train and cfg.train.device
  if type(device) ~= "string" or not device:match("^cuda") then return nil end
  for _, k in ipairs(M.step_kernels(cfg)) do
    local have = M.cuda_kernels[k.family]
    if not (have == true or (type(have) == "table" and have[k.dtype])) then
      return string.format("train.device=%s: %s runs the %s kernels in %s, which have no " ..
                           "CUDA implementation; train on train.device=cpu, or pick a layout " ..
                           "or train.precision without them", device, k.why, k.family, k.dtype)
    end
  end
  return nil
end

-- The number a forward's rows (tokens of a micro-batch on one rank) must be a multiple of:
-- 16 for FP8 layers on CUDA (cuBLASLt's FP8 GEMMs, engine/cuda/fp8_linear.cu), else 1.
-- Training batches are checked against it (config/schema/fp8.lua); a generation window is
-- padded to it (tetra.train.generate).
function M.row_multiple(cfg)
  local t = (cfg and cfg.train) or {}
  return (t.precision == "fp8" and tostring(t.device):match("^cuda")) and 16 or 1
end

-- Every problem of cfg's layout (an empty array when there is none). world: the number
-- of processes (nil: not checked).
function M.problems(cfg, world)
  local out, s = {}, M.sizes(cfg)
  mesh_rules(cfg, s, world, out)
  tensor_rules(cfg, s, out)
  context_rules(cfg, s, out)
  pipeline_rules(cfg, s, out)
  out[#out + 1] = M.device_problem(cfg)
  return out
end

return M
