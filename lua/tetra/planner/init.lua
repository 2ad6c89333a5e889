-- tetra.planner: what a parallel layout will cost before it runs. For a model (cfg.model), a
-- global batch (cfg.train.batch_size sequences of cfg.model.seq_len tokens) and a cluster,
-- it predicts every rank's memory and the step time of each layout, and ranks them.
--
--   local plan = require("tetra.planner")
--   local cl = plan.cluster("h100", { nodes = 4 })
--   local rows = plan.search(cfg, cl)             -- every valid layout, best first
--   local r = plan.evaluate(cfg, layout, cl)      -- one layout
--   plan.yaml(cfg, r)                             -- that layout as a config for tetra run
--
-- Memory is the engine's own accounting, not a rule of thumb:
--   * parameters come from the model's shapes (the module paths its model.lua builds, as
--     recipes/<family>/presets.lua lists them) sliced by its plan (plan.lua) with the
--     styles and part sizes of tetra.parallel.tensor, and kept per pipeline stage as
--     tetra.parallel.pipeline splits the blocks;
--   * activations are every tensor a block's forward makes, since the autograd tape
--     retains each op's inputs and output until backward (engine/core/autograd.c), with the
--     copies tensor parallelism adds, times the micro-batches a stage holds at once
--     under the engine's own pipeline schedule (tetra.parallel.pipeline.schedule,
--     replayed here), plus the gradients alive when backward starts;
--   * every tensor is rounded to the caching allocator's size class
--     (tt_alloc_granted_bytes), which is what the metrics' peak_bytes counts.
-- Step time is a roofline of the same work: matmul FLOPs at the device's matmul rate,
-- attention FLOPs at its attention rate, elementwise traffic at its memory bandwidth,
-- all times one sustained fraction (the share of those kernel rates a whole training step
-- reaches: launch gaps, small kernels, the loader), plus communication from ring
-- collectives over the links each group spans, the pipeline's bubble from the same
-- schedule replay, and the optimizer. What computation hides is not counted: Tetra's
-- tensor- and context-parallel collectives block (exposed); the data-parallel reduction
-- overlaps the last micro-batch's backward (the last bucket stays exposed, the embedding's
-- hidden by the deferred weight gradients); ZeRO-1's
-- parameter all-gather after the optimizer is exposed. Activation recompute (full, or
-- torchtitan's per-op selective policy), FP8 matmuls (opts of M.layouts) and eager
-- elementwise kernels (cluster.elementwise = "eager") are priced only to compare
-- published runs that used them: Tetra's engine does none of these.
local C = require("tetra.ffi").C
local tensor_split = require("tetra.parallel.tensor")
local pipeline = require("tetra.parallel.pipeline")
local layout_rules = require("tetra.parallel.layout")
local models = require("tetra.models")
local flops = require("tetra.obs.mfu").flops

local M = {}

-- -- Clusters --------------------------------------------------------------------------

-- A device: peak_flops (dense, the precision's), matmul and attention kernel rates as
-- fractions of it, mem_bw (bytes/s for elementwise kernels), mem_bytes, and `sustained`
-- (the fraction of those kernel rates a whole training step reaches); elementwise =
-- "eager" when every elementwise op is its own kernel (eager_block_bytes), else fused
-- kernels are assumed (one read and one write an op). Links: intra_bw
-- (bytes/s per device and direction inside a node), inter_bw (per device, between
-- nodes), latency_s per collective step.
-- Sources: H100 SXM: NVIDIA H100 datasheet (989 TFLOP/s dense BF16, 1,979 FP8, 3.35 TB/s
-- HBM3, 80 GB, NVLink 4 at 900 GB/s both directions); H200: NVIDIA H200 datasheet
-- (same compute, 141 GB HBM3e at 4.8 TB/s). 400 Gb/s InfiniBand per GPU = 50 GB/s.
-- matmul 0.80: cuBLAS BF16 GEMMs measured ~790 TFLOP/s on an H200 (docs/planner.md);
-- attention 0.55: FlashAttention-3 / cuDNN forward+backward at head dim 128 (Shah et al.
-- 2024, "FlashAttention-3", arXiv:2407.08608, fig. 5-6: ~500-600 TFLOP/s).
-- sustained 0.636: calibrated once, on Megatron-LM's 96-GPU GPT-3 175B row (47% MFU);
-- every other published row is a prediction (docs/planner.md).
-- cpu: this machine (2 Zen 4 cores, one rank per core, fp32, MPI over shared memory):
-- peak 105 GFLOP/s, one core's OpenBLAS sgemm (DESIGN.md: ~210 on 2 cores); attention
-- 0.6 of it (tools/bench/engine's causal attention forward+backward at 0.43-0.70);
-- links 12 us and 1.7 GB/s, an all-reduce between 2 ranks (tools/bench/plan_comm.lua,
-- 2026-12-01 05:44 UTC); sustained 1.0: the README's quiet-machine one-process, one-thread
-- run of the layouts benchmark model (3,059 tokens/s). mem_bw 8 GB/s per core is an
-- estimate. A shared machine runs slower than all of these: tools/bench/plan.sh and
-- `tetra sweep --calibrate` measure the links and the sustained fraction first.
M.clusters = {
  h100 = { name = "H100 SXM nodes (8 GPUs, NVLink 4, 400 Gb/s InfiniBand per GPU)",
           devices_per_node = 8, nodes = 1, peak_flops = 989e12, fp8_flops = 1979e12,
           matmul = 0.80, attention = 0.55, mem_bw = 3.35e12, mem_bytes = 80e9,
           intra_bw = 450e9, inter_bw = 50e9, latency_s = 10e-6, sustained = 0.636,
           precision = "bf16" },
  h200 = { name = "H200 SXM nodes (8 GPUs, NVLink 4, 400 Gb/s InfiniBand per GPU)",
           devices_per_node = 8, nodes = 1, peak_flops = 989e12, fp8_flops = 1979e12,
           matmul = 0.80, attention = 0.55, mem_bw = 4.8e12, mem_bytes = 141e9,
           intra_bw = 450e9, inter_bw = 50e9, latency_s = 10e-6, sustained = 0.636,
           precision = "bf16" },
  -- torchtitan's benchmark machines (pytorch/torchtitan
  -- benchmarks/llama3_h100_202412_torchtitan.md, formerly docs/performance.md): Grand
  -- Teton hosts of 8 H100 with 96 GB HBM2e at 2.4 TB/s, 400 Gb/s per GPU between hosts,
  -- "the default 500W power limit". Its footnote: "the actual peak TFLOPs number is
  -- between SXM and NVL, and we don't know its exact value": between the H100 SXM's 989
  -- and the H100 NVL's 835 dense BF16 TFLOP/s (NVIDIA H100 datasheet: 1,671 with
  -- sparsity); the planner takes the middle, 912 (either end moves a prediction 8%).
  h100_500w = { name = "H100 HBM2e 96 GB at 500 W (torchtitan's Grand Teton nodes)",
                devices_per_node = 8, nodes = 1, peak_flops = 912e12, fp8_flops = 1824e12,
                matmul = 0.80, attention = 0.55, mem_bw = 2.4e12, mem_bytes = 96e9,
                intra_bw = 450e9, inter_bw = 50e9, latency_s = 10e-6, sustained = 0.636,
                precision = "bf16" },
  cpu = { name = "this machine: 2 CPU cores, one rank per core (fp32, MPI shared memory)",
          devices_per_node = 2, nodes = 1, peak_flops = 105e9, matmul = 1.0,
          attention = 0.6, mem_bw = 8e9, mem_bytes = 12e9, intra_bw = 1.7e9,
          inter_bw = 1.7e9, latency_s = 12e-6, sustained = 1.0, precision = "fp32" },
}

-- The preset `name` with `over` (any of its fields) applied; one line if unknown.
function M.cluster(name, over)
  local base = M.clusters[name]
  if not base then
    local names = {}
    for k in pairs(M.clusters) do names[#names + 1] = k end
    table.sort(names)
    error(string.format("unknown cluster '%s': choose one of %s", tostring(name),
                        table.concat(names, ", ")), 0)
  end
  local c = {}
  for k, v in pairs(base) do c[k] = v end
  for k, v in pairs(over or {}) do c[k] = v end
  c.sync_wait = c.sync_wait or 0   -- no preset carries one: a measured figure (--sync-wait)
  c.devices = c.devices_per_node * c.nodes
  return c
end

-- -- The model's parameters ------------------------------------------------------------

local function granted(bytes)
  if bytes <= 0 then return 0 end
  return tonumber(C.tt_alloc_granted_bytes(bytes))
end

-- Every parameter of the whole model as { module path, param name, shape }, in the
-- order its forward uses them (recipes/<family>/presets.lua lists them). m: cfg.model.
function M.parameters(m)
  return models.of(m).parameters(m)
end

-- Whether the head reuses the embedding's matrix.
local function tied(m)
  return models.of(m).tied == true or m.tie_embeddings == true
end

-- The model's parallel plan (recipes/<family>/plan.lua).
function M.model_plan(m)
  return models.plan(models.of(m).name)
end

-- The tensor-parallel style the plan gives module `path`, nil when none.
local function style_of(plan, path)
  for _, e in ipairs(plan.tensor or {}) do
    if path:match(require("tetra.parallel").plan_pattern(e[1])) then return e[2] end
  end
end

-- Elements of param `name` (shape, of a module with `style`) that tp rank `r` holds:
-- the slice tetra.parallel.tensor gives it (tensor.slice).
local function local_numel(shape, name, style, tp, r, head_dim)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local part = tp > 1 and style and tensor_split.slice(style, name, shape, tp, r, head_dim)
  if not part then return n end
  return n / shape[part.dim + 1] * part.length
end

-- The blocks (0-based layer indices) of pipeline stage s (0-based) of pp, chunk by chunk:
-- { {first, last}, ... } one per virtual chunk, as tetra.parallel.pipeline splits them.
local function stage_blocks(L, pp, v, s)
  local counts = pipeline.stage_layers(L, pp * v)
  local starts, at = {}, 0
  for i = 1, #counts do starts[i] = at; at = at + counts[i] end
  local out = {}
  for c = 0, v - 1 do
    local vs = c * pp + s + 1
    out[#out + 1] = { starts[vs], starts[vs] + counts[vs] - 1 }
  end
  return out
end

-- This rank's parameters: a list of element counts (one per tensor, a tied matrix once
-- per stage that holds it), for tp rank r on pipeline stage s. Also returns the elements
-- of matmul weights (for FLOPs) split as { blocks = per-block, head = ... }.
local function rank_params(m, lay, s, r)
  local plan = M.model_plan(m)
  local pplan = plan.pipeline or {}
  local hd = m.dim / m.n_heads
  local blocks = stage_blocks(m.n_layers, lay.pp, lay.v, s)
  local function keeps(path)
    local layer = path:match("^[%w_]+%.(%d+)%.")
    if layer then
      layer = tonumber(layer)
      for _, b in ipairs(blocks) do
        if layer >= b[1] and layer <= b[2] then return true end
      end
      return false
    end
    local root = path:match("^[^.]+")
    for _, p in ipairs(pplan.first or {}) do if p == root then return s == 0 end end
    for _, p in ipairs(pplan.last or {}) do if p == root then return s == lay.pp - 1 end end
    return true
  end
  local fam = models.of(m)
  local tensors, seen_tied = {}, false
  for _, e in ipairs(M.parameters(m)) do
    local path, name, shape = e[1], e[2], e[3]
    local is_head, is_embed = path == fam.head, path == fam.embedding
    local skip = false
    if tied(m) and (is_head or is_embed) then
      -- One matrix: held once on a single stage, once on each end stage otherwise.
      if lay.pp == 1 then skip = seen_tied; seen_tied = true end
    end
    if not skip and keeps(path) then
      tensors[#tensors + 1] = local_numel(shape, name, style_of(plan, path), lay.tp, r, hd)
    end
  end
  return tensors
end

-- The matmuls of one block on a tp rank, in the order its forward runs them (the order
-- M.parameters lists them: q, k, v, o, then the MLP's), each { weights = elements,
-- out = output features per token }: a row-parallel output is whole (partial sums).
local function block_matmuls(m, tp)
  local plan = M.model_plan(m)
  local hd = m.dim / m.n_heads
  local out = {}
  for _, e in ipairs(M.parameters(m)) do
    local path, name, shape = e[1], e[2], e[3]
    if #shape == 2 and name == "weight" and path:match("^[%w_]+%.0%.") then
      local style = style_of(plan, path)
      local w = local_numel(shape, name, style, tp, 0, hd)
      local features = style == "row" and shape[1] or w / shape[2]
      out[#out + 1] = { weights = w, out = features }
    end
  end
  return out
end

-- Elements of one block's matmul weights on a tp rank, and of the head's.
local function matmul_params(m, tp)
  local plan = M.model_plan(m)
  local hd = m.dim / m.n_heads
  local block, head = 0, 0
  for _, mm in ipairs(block_matmuls(m, tp)) do block = block + mm.weights end
  local head_path = models.of(m).head
  for _, e in ipairs(M.parameters(m)) do
    local path, name, shape = e[1], e[2], e[3]
    if path == head_path then
      head = local_numel(shape, name, style_of(plan, path), tp, 0, hd)
    end
  end
  return block, head
end

-- Model FLOPs per token (forward + backward) as Megatron-LM and torchtitan count them
-- (tetra.obs.mfu.flops), the multiplied parameters being the matmul weights (blocks and
-- head; not the embedding lookup).
function M.flops_per_token(m)
  local block, head = matmul_params(m, 1)
  return flops(m.n_layers * block + head, m)
end

-- Parameters of the whole model (a tied matrix once).
function M.parameter_count(m)
  local n = 0
  for _, e in ipairs(M.parameters(m)) do
    local k = 1
    for _, s in ipairs(e[3]) do k = k * s end
    if not (tied(m) and e[1] == models.of(m).head) then n = n + k end
  end
  return n
end

-- -- Layouts ----------------------------------------------------------------------------

-- The layout fields of a config: sizes, zero stage, sequence parallelism, micro-batch,
-- schedule. lay: { tp, cp, dp, pp, v, zero, sp, micro_batch, schedule, recompute }.
local function layout_of(cfg)
  local p, s = cfg.parallel or {}, layout_rules.sizes(cfg)
  return { tp = s.tp, cp = s.cp, dp = s.dp, pp = s.pp, v = s.virtual,
           zero = p.zero_stage or 0, sp = p.sequence_parallel == true,
           micro_batch = s.micro_batch, schedule = p.pipeline_schedule or "1f1b",
           recompute = "none" }
end
M.layout_of = layout_of

-- cfg with lay's sizes in it (a copy of the parallel and train sections).
local function with_layout(cfg, lay)
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  c.parallel, c.train = {}, {}
  for k, v in pairs(cfg.parallel or {}) do c.parallel[k] = v end
  for k, v in pairs(cfg.train or {}) do c.train[k] = v end
  local p = c.parallel
  for dim, key in pairs(layout_rules.size_keys) do p[key] = lay[dim] end
  p.zero_stage, p.sequence_parallel = lay.zero, lay.sp
  p.pipeline_schedule, p.virtual_pipeline_size = lay.schedule, lay.v
  c.train.gradient_accumulation_steps = c.train.batch_size / (lay.dp * lay.micro_batch)
  c.train.micro_batch_size = nil
  return c
end
M.with_layout = with_layout

-- -- Pipeline replay -----------------------------------------------------------------

-- Replays the engine's schedule (tetra.parallel.pipeline.schedule) for every stage with
-- per-chunk forward and backward times fwd[s][c], bwd[s][c] and a transfer time `hop`
-- between stages. Returns the makespan, each stage's busy time and the most
-- micro-batches each stage holds at once per chunk ({ [s] = { [c] = n } }).
function M.replay(lay, n_micro, fwd, bwd, hop)
  local S, v = lay.pp, lay.v
  local kind = S == 1 and "1f1b" or lay.schedule   -- one stage: F, B, F, B ...
  local ops, pos, clock, busy, held, peak = {}, {}, {}, {}, {}, {}
  for s = 0, S - 1 do
    ops[s] = pipeline.schedule(kind, S, s, n_micro, v)
    pos[s], clock[s], busy[s], held[s], peak[s] = 1, 0, 0, {}, {}
    for c = 0, v - 1 do held[s][c], peak[s][c] = 0, 0 end
  end
  local done = {}   -- (direction, virtual stage, micro-batch) -> finish time
  local function key(kind_, vs, m) return ((kind_ == "F" and 0 or 1) * S * v + vs) * n_micro + m end
  local last_vs = S * v - 1
  local left = 0
  for s = 0, S - 1 do left = left + #ops[s] end
  while left > 0 do
    local progressed = false
    for s = 0, S - 1 do
      local op = ops[s][pos[s]]
      while op do
        local kind_, m, c = op[1], op[2], op[3] or 0
        local vs = c * S + s
        local dep
        if kind_ == "F" then
          dep = vs == 0 and 0 or done[key("F", vs - 1, m)]
          if dep and vs > 0 then dep = dep + hop end
        else
          dep = vs == last_vs and done[key("F", vs, m)] or done[key("B", vs + 1, m)]
          if dep and vs < last_vs then dep = dep + hop end
        end
        if not dep then break end
        local dur = kind_ == "F" and fwd[s][c] or bwd[s][c]
        local start = math.max(clock[s], dep)
        clock[s] = start + dur
        busy[s] = busy[s] + dur
        done[key(kind_, vs, m)] = clock[s]
        if kind_ == "F" then
          held[s][c] = held[s][c] + 1
          if held[s][c] > peak[s][c] then peak[s][c] = held[s][c] end
        else
          held[s][c] = held[s][c] - 1
        end
        pos[s], left, progressed = pos[s] + 1, left - 1, true
        op = ops[s][pos[s]]
      end
    end
    if not progressed then error("pipeline replay: the schedule deadlocks", 0) end
  end
  local span = 0
  for s = 0, S - 1 do span = math.max(span, clock[s]) end
  return span, busy, peak
end

-- -- Costs ------------------------------------------------------------------------------

-- A ring collective over `n` ranks moving `bytes` (the whole tensor): all-reduce moves
-- 2 (n-1)/n of it per rank, all-gather and reduce-scatter (n-1)/n.
local function ring(kind, bytes, n, bw, lat)
  if n <= 1 or bytes <= 0 then return 0 end
  local f = kind == "all_reduce" and 2 * (n - 1) / n or (n - 1) / n
  local steps = kind == "all_reduce" and 2 * (n - 1) or (n - 1)
  return f * bytes / bw + steps * lat
end

-- The link a group uses: inside a node when it spans no more than one node's devices
-- (the mesh order is tp, cp, dp, pp, tensor fastest).
local function link(cl, stride, size)
  if stride * size <= cl.devices_per_node then return cl.intra_bw end
  return cl.inter_bw
end

-- Bytes per activation element, per parameter (weights the optimizer updates, plus a
-- low-precision copy), per gradient.
local function widths(precision)
  if precision == "fp32" then return 4, 4, 4 end
  return 2, 4 + 2, 4
end

-- The bytes one Llama block's elementwise forward moves for n tokens (Hl query and kvl
-- key/value heads, fl MLP features on this rank) when every op is its own kernel, as in
-- eager PyTorch (cl.elementwise = "eager"; the default counts one read and one write per
-- fused op). The ops are torchtitan's Llama (torchtitan/models/llama/model.py and
-- models/norms.py at commit 9dec370): RMSNorm in fp32 (x.float(), pow, mean, x * rsqrt,
-- type_as, * weight: 4 activation-width and 7 fp32 passes per element, twice per block),
-- RoPE through fp32 complex numbers on q and k (float, multiply, type_as: 2 + 4), the
-- key and value heads copied to every query head (repeat_kv), attention's output made
-- contiguous, two residual adds, silu(w1 x) * w3 x. Backward is priced at twice this,
-- as for fused kernels.
local function eager_block_bytes(m, n, Hl, kvl, fl, act_b)
  if not models.of(m).eager_elementwise then
    local counted = {}
    for _, name in ipairs(models.names()) do
      if models.get(name).eager_elementwise then counted[#counted + 1] = name end
    end
    error("cluster.elementwise = eager is counted for the " .. table.concat(counted, ", ") ..
          " family only, not '" .. tostring(m.family) .. "'; leave it unset for fused " ..
          "elementwise kernels", 0)
  end
  local hd = m.dim / m.n_heads
  local q, kv, f32 = Hl * hd, kvl * hd, 4
  local norm = 4 * act_b + 7 * f32
  local rope = 2 * act_b + 4 * f32
  local repeat_kv = kvl < Hl and 2 * (kv + q) * act_b or 0
  local per_token = 2 * norm * m.dim + rope * (q + kv) + repeat_kv + 2 * q * act_b +
                    2 * 3 * m.dim * act_b + 5 * fl * act_b
  return n * per_token
end

-- Evaluates layout `lay` for cfg on cluster cl: a record with the layout, memory (bytes,
-- the largest rank and rank 0), time (seconds) and throughput.
function M.evaluate(cfg, lay, cl)
  local m, t = cfg.model, cfg.train
  local sizes = layout_rules.sizes(with_layout(cfg, lay))
  local W, n_micro = sizes.world, sizes.micro_batches
  local T, d, f, V, L = m.seq_len, m.dim, m.ffn_hidden, m.vocab_size, m.n_layers
  local H = m.n_heads
  local hd = d / H
  local kv = m.n_kv_heads or H
  local tp, cp, pp, v = lay.tp, lay.cp, lay.pp, lay.v
  local act_b, par_b, grad_b = widths(cl.precision)
  local mb = lay.micro_batch
  local n = mb * T / cp                        -- tokens of one micro-batch on this rank
  local seq_n = lay.sp and n / tp or n        -- the residual stream's tokens
  local Hl = H / tp
  local kvl = kv >= tp and kv / tp or 1
  local fl = f / tp
  local block = models.of(m).block

  -- Activations. The autograd tape holds every op's inputs and output until backward
  -- (engine/core/autograd.c: tt_record retains both), so a micro-batch in flight costs every
  -- tensor its forward made; views share storage and cost nothing. Under tensor
  -- parallelism each column-parallel linear gets its own copy of its input
  -- (copy_to_group clones; sp_gather gathers) and each row-parallel output is summed
  -- into a new tensor. Element counts, one entry per tensor, of one block:
  local nd, nds = n * d, seq_n * d           -- whole sequence; the residual stream
  local stats = block.layer_norm and 2 * seq_n or seq_n   -- LayerNorm: mean, 1/std; RMSNorm: 1/rms
  local tensors = {}
  local function keep(e) tensors[#tensors + 1] = e end
  if lay.recompute == "full" then
    keep(nds)                                   -- only the block's input is kept
  elseif lay.recompute == "selective" then
    -- torchtitan's per-op policy (block_time below): the block's input, every odd
    -- matmul's output, attention's output and log-sum-exp; the rest is recomputed.
    keep(nds)
    for i, mm in ipairs(block_matmuls(m, tp)) do
      if i % 2 == 1 then keep(n * mm.out) end
    end
    keep(n * Hl * hd); keep(n * Hl)
  else
    keep(nds); keep(stats)                      -- norm 1
    if tp > 1 then keep(nd); keep(nd); keep(nd) end   -- wq, wk, wv inputs
    keep(n * Hl * hd)                           -- wq (RoPE rotates it in place)
    keep(n * kvl * hd)                          -- wk (the same)
    keep(n * kvl * hd)                          -- wv
    if cp > 1 then keep(mb * T * kvl * hd); keep(mb * T * kvl * hd) end  -- k, v gathered
    keep(n * Hl * hd); keep(n * Hl)             -- attention output, log-sum-exp
    keep(tp > 1 and nd or nds)                  -- wo (partial sums under tp)
    if tp > 1 then keep(nds); if block.out_bias then keep(nds) end end   -- summed (+ bias)
    keep(nds)                                   -- residual
    keep(nds); keep(stats)                      -- norm 2
    if tp > 1 then keep(nd); if block.gated_mlp then keep(nd) end end  -- MLP inputs
    keep(n * fl); keep(n * fl)                  -- w1, w3 (c_fc, gelu)
    if block.gated_mlp then keep(n * fl) end    -- swiglu
    keep(tp > 1 and nd or nds)                  -- w2 (partial sums under tp)
    if tp > 1 then keep(nds); if block.out_bias then keep(nds) end end
    keep(nds)                                   -- residual: the block's output
  end
  local block_act = 0
  for _, e in ipairs(tensors) do block_act = block_act + granted(e * act_b) end
  local Vl = math.ceil(V / tp)
  -- The first stage's embedding output (the vocab-parallel one's partial sums and their
  -- sum; learned positions added to it); a later stage's received activations instead.
  local embed_act = granted(nds * act_b)
  if tp > 1 then embed_act = embed_act + granted(nd * act_b) end
  if block.learned_positions then embed_act = embed_act + 2 * granted(nds * act_b) end
  local recv_act = granted(nds * act_b)
  -- The last stage's head: final norm, the head's input copy under tp, the logits.
  local head_act = granted(nds * act_b) + granted(stats * act_b) +
                   (tp > 1 and granted(nd * act_b) or 0) + granted(n * Vl * 4)
  -- When backward starts: the logits' gradient, the head weight's gradient and the
  -- gradient of its input exist at once. The weight's gradient is a new tensor only when
  -- the weight has none yet: a later micro-batch's GEMM adds into the one there (beta = 1).
  local head_peak = granted(n * Vl * 4) + granted(nd * act_b)
  local head_wgrad = granted(Vl * d * 4)

  -- Per-chunk times of one micro-batch.
  local rate_mm = cl.peak_flops * cl.matmul * cl.sustained
  local rate_mm8 = (lay.fp8 and cl.fp8_flops or cl.peak_flops) * cl.matmul * cl.sustained
  local rate_at = cl.peak_flops * cl.attention * cl.sustained
  local rate_bw = cl.mem_bw * cl.sustained
  local block_w, head_w = matmul_params(m, tp)
  local rerun_w = 0                             -- every second matmul's weights
  for i, mm in ipairs(block_matmuls(m, tp)) do
    if i % 2 == 0 then rerun_w = rerun_w + mm.weights end
  end
  local bw_tp = link(cl, 1, tp)
  local function block_time()
    local mm = 2 * n * block_w / rate_mm8
    local at = 2 * n * T * d / tp / rate_at             -- 4 n (T/2) hd Hl: causal half
    local ew_bytes = cl.elementwise == "eager" and eager_block_bytes(m, n, Hl, kvl, fl, act_b)
                     or (10 * seq_n * d + 2 * n * (Hl + kvl) * hd + 3 * n * fl) * act_b
    local ew = ew_bytes / rate_bw
    local fwd, bwd = mm + at + ew, 2 * mm + 2.5 * at + 2 * ew
    -- Recompute: full reruns the block's forward in backward. selective is torchtitan's
    -- per-op policy (selective_ac_option = "op"; `_save_list` and `_custom_policy` in
    -- torchtitan/parallelisms/parallelize_llama.py at the benchmarks' commit 9dec370):
    -- it saves the outputs of matmuls and attention except every second matmul of the
    -- block, counted in forward order, so backward reruns those (wk, wo and w3 in a
    -- Llama block: 37% of its matmul FLOPs) and every elementwise op. Rerun FLOPs cost
    -- time but are not model FLOPs (MFU does not count them).
    if lay.recompute == "full" then bwd = bwd + mm + at + ew
    elseif lay.recompute == "selective" then bwd = bwd + 2 * n * rerun_w / rate_mm8 + ew end
    local comm_f, comm_b = 0, 0
    if tp > 1 then
      local kind = lay.sp and "all_gather" or "all_reduce"
      local one = ring(kind, n * d * act_b, tp, bw_tp, cl.latency_s)
      if lay.sp then one = one + ring("reduce_scatter", n * d * act_b, tp, bw_tp, cl.latency_s) end
      comm_f, comm_b = 2 * one, 2 * one
    end
    if cp > 1 then
      local bw_cp = link(cl, tp, cp)
      local kvbytes = 2 * mb * T * kvl * hd * act_b
      comm_f = comm_f + ring("all_gather", kvbytes, cp, bw_cp, cl.latency_s)
      comm_b = comm_b + ring("reduce_scatter", kvbytes * 4 / act_b, cp, bw_cp, cl.latency_s)
    end
    -- Overlapped tensor-parallel communication (cl.overlap_tp) shows only where it
    -- outlasts the block's matmuls.
    if cl.overlap_tp then comm_f, comm_b = math.max(0, comm_f - mm), math.max(0, comm_b - 2 * mm) end
    -- Blocking collectives also wait for the last rank to arrive: cl.sync_wait of the
    -- computation since the previous one (the block's syncs split its work between them,
    -- so the waits add up to that share of the whole).
    if (tp > 1 or cp > 1) and not cl.overlap_tp then
      comm_f, comm_b = comm_f + cl.sync_wait * fwd, comm_b + cl.sync_wait * bwd
    end
    return fwd, bwd, comm_f, comm_b
  end
  local bf, bb, bcf, bcb = block_time()
  local head_mm = 2 * n * head_w / rate_mm
  local head_ew = (3 * n * Vl * 4 + 4 * seq_n * d * act_b) / rate_bw
  local head_f, head_b = head_mm + head_ew, 2 * head_mm + head_ew
  local head_comm = tp > 1 and 2 * ring("all_reduce", n * 4 * 3, tp, bw_tp, cl.latency_s) +
                    cl.sync_wait * (head_f + head_b) or 0
  local embed_comm = tp > 1 and ring("all_reduce", n * d * act_b, tp, bw_tp, cl.latency_s) or 0

  local fwd, bwd, comm_mb = {}, {}, {}
  for s = 0, pp - 1 do
    fwd[s], bwd[s], comm_mb[s] = {}, {}, 0
    for c, b in ipairs(stage_blocks(L, pp, v, s)) do
      local nb = b[2] - b[1] + 1
      local fw, bk = nb * (bf + bcf), nb * (bb + bcb)
      comm_mb[s] = comm_mb[s] + nb * (bcf + bcb)
      local vs = (c - 1) * pp + s
      if vs == pp * v - 1 then
        fw, bk = fw + head_f + head_comm / 2, bk + head_b + head_comm / 2
        comm_mb[s] = comm_mb[s] + head_comm
      end
      if vs == 0 then
        fw = fw + embed_comm
        comm_mb[s] = comm_mb[s] + embed_comm
      end
      fwd[s][c - 1], bwd[s][c - 1] = fw, bk
    end
  end
  local hop = pp > 1 and (seq_n * d * act_b / link(cl, lay.tp * lay.cp * lay.dp, pp) +
                          cl.latency_s) or 0
  local span, busy, held = M.replay(lay, n_micro, fwd, bwd, hop)

  -- Per stage: parameters, optimizer state, buffers, activations; then the optimizer
  -- and data-parallel time of the slowest stage.
  local group = lay.dp * cp                      -- gradients average over dp x cp
  local bw_dp = link(cl, tp, group)
  local stages, worst, worst_s = {}, nil, 0
  for s = 0, pp - 1 do
    local elems, pbytes, gbytes, nparams = rank_params(m, lay, s, 0), 0, 0, 0
    for _, e in ipairs(elems) do
      pbytes = pbytes + granted(e * par_b)
      gbytes = gbytes + granted(e * grad_b)
      nparams = nparams + e
    end
    local zero = lay.zero == 1 and group > 1
    local padded = math.ceil(nparams / group) * group
    local obytes, cbytes
    if zero then
      obytes = 2 * granted(padded / group * 4)
      cbytes = granted(padded * 4) + granted(padded / group * 4)
    else
      obytes = 0
      for _, e in ipairs(elems) do obytes = obytes + 2 * granted(e * 4) end
      cbytes = group > 1 and granted(nparams * 4) or 0
    end
    -- The peak: every micro-batch this stage holds at once (the schedule replay), and
    -- when backward starts the head's gradients (last stage) or the received gradient;
    -- the parameters' gradients are there already once an earlier micro-batch's
    -- backward ran (several micro-batches), else they grow while activations go.
    local act = 0
    for c, b in ipairs(stage_blocks(L, pp, v, s)) do
      local nb = b[2] - b[1] + 1
      local vs = (c - 1) * pp + s
      local per = nb * block_act + (vs == 0 and embed_act or recv_act)
      if vs == pp * v - 1 then per = per + head_act end
      act = act + held[s][c - 1] * per
    end
    local at_head = head_peak + (n_micro == 1 and head_wgrad or 0)
    act = act + (s == pp - 1 and at_head or recv_act)
    local at_peak = pbytes + obytes + cbytes +
                    (n_micro > 1 and gbytes + act or math.max(act, gbytes + at_head))
    -- The optimizer: AdamW reads param, grad, m, v and writes param, m, v (fp32).
    local opt_elems = zero and padded / group or nparams
    local t_opt = 28 * opt_elems / rate_bw
    -- Gradients are reduced (and ZeRO-1's parameters gathered) in fp32 by Tetra;
    -- cl.dp_bytes overrides that for engines that reduce in bf16.
    local dp_b = cl.dp_bytes or 4
    local grad_bytes = nparams * dp_b
    local t_dp, t_ag = 0, 0
    if group > 1 then
      local kind = zero and "reduce_scatter" or "all_reduce"
      local total = ring(kind, grad_bytes, group, bw_dp, cl.latency_s)
      -- What is still in flight when backward ends: with fixed buckets a whole one;
      -- Tetra's reducer shrinks them toward the end (engine/dist/reducer.c), leaving 1/32
      -- of the gradient bytes, or the first-registered parameter (the embedding) where it
      -- is larger: it is produced last and travels alone. Unless the weight gradients
      -- that follow it are deferred (dist.defer_weight_grads, parallel/data.lua: as many
      -- elements as the embedding, at most half of the rest, about half their backward's
      -- work): then it travels while they are computed.
      local hidden = 0
      for c = 0, v - 1 do hidden = hidden + bwd[s][c] end
      local cap = (cfg.dist and cfg.dist.bucket_mb or 25) * 2 ^ 20
      local tail = math.min(cap, grad_bytes, grad_bytes / 32)
      local first = math.min(cap, (elems[1] or 0) * dp_b)
      local last
      if cl.fixed_buckets then
        last = ring(kind, math.min(grad_bytes, cap), group, bw_dp, cl.latency_s)
      elseif first <= tail then
        last = ring(kind, tail, group, bw_dp, cl.latency_s)
      else
        last = ring(kind, first, group, bw_dp, cl.latency_s)
        local rest = nparams - elems[1]
        if s == 0 and rest > 0 and (cfg.dist or {}).defer_weight_grads ~= false then
          local hide = 0.5 * hidden * math.min(elems[1], rest / 2) / rest
          last = math.max(ring(kind, tail, group, bw_dp, cl.latency_s), last - hide)
        end
      end
      t_dp = math.max(last, total - hidden)
      if zero then
        t_ag = ring("all_gather", padded * dp_b, group, bw_dp, cl.latency_s)
        -- Gathered while the next step's first forward runs (cl.overlap_param_gather).
        if cl.overlap_param_gather then t_ag = math.max(0, t_ag - fwd[s][0]) end
      end
    end
    local st = { params = pbytes, grads = gbytes, optimizer = obytes, comm = cbytes,
                 activations = act, t_opt = t_opt, t_dp = t_dp + t_ag, busy = busy[s],
                 comm_mb = comm_mb[s], n_params = nparams }
    st.total = at_peak
    stages[s + 1] = st
    if not worst or st.total > worst.total then worst, worst_s = st, s end
  end
  local tail = 0
  for _, st in ipairs(stages) do tail = math.max(tail, st.t_opt + st.t_dp) end
  local step = span + tail
  -- Split of the step on the busiest stage: its compute, its exposed communication
  -- (blocking collectives, data-parallel tail), and the bubble (idle in the schedule).
  local crit, crit_busy = stages[1], -1
  for _, st in ipairs(stages) do
    if st.busy > crit_busy then crit, crit_busy = st, st.busy end
  end
  local comm_blocking = crit.comm_mb * n_micro
  local compute = crit.busy - comm_blocking + crit.t_opt
  local bubble = math.max(0, span - crit.busy)
  local exposed = comm_blocking + crit.t_dp
  local tokens = t.batch_size * T
  local tps = tokens / step
  local mfu = tps * M.flops_per_token(m) / (W * cl.peak_flops)
  local r0 = stages[1]
  return {
    dp = lay.dp, tp = tp, pp = pp, cp = cp, zero_stage = lay.zero, sequence_parallel = lay.sp,
    micro_batch = mb, grad_accum = n_micro, schedule = pp > 1 and lay.schedule or "-",
    virtual = v, recompute = lay.recompute, world = W,
    mem = { params = worst.params, grads = worst.grads, optimizer = worst.optimizer,
            activations = worst.activations, comm = worst.comm, total = worst.total,
            stage = worst_s },
    mem_rank0 = r0.total,
    mem_gib = worst.total / 2 ^ 30,
    fits = worst.total <= cl.mem_bytes,
    step_s = step, compute_s = compute, exposed_comm_s = exposed, bubble_s = bubble,
    tokens_per_s = tps, tokens_per_s_per_device = tps / W, mfu = mfu,
  }
end

-- -- Search -------------------------------------------------------------------------------

local function divisors(n)
  local out = {}
  for i = 1, n do if n % i == 0 then out[#out + 1] = i end end
  return out
end

-- Every layout of cl.devices ranks for cfg that the layout rules accept (tensor
-- parallelism within a node), each micro-batch size, ZeRO-1 on and off, sequence
-- parallelism on and off, each pipeline schedule. opts.fixed: { tp =, pp =, dp =, cp = }
-- sizes to keep; opts.max_micro_batch: the largest micro-batch tried (16);
-- opts.recompute ("full", "selective"): price activation recompute (not in the engine:
-- for comparing published runs that used it); opts.fp8: FP8 matmuls.
function M.layouts(cfg, cl, opts)
  opts = opts or {}
  local W, B = cl.devices, cfg.train.batch_size
  local fx = opts.fixed or {}
  local out = {}
  for _, tp in ipairs(divisors(math.min(W, cl.devices_per_node))) do
    for _, cp in ipairs(divisors(W / tp)) do
      for _, pp in ipairs(divisors(W / (tp * cp))) do
        local dp = W / (tp * cp * pp)
        local ok = (not fx.tp or fx.tp == tp) and (not fx.cp or fx.cp == cp) and
                   (not fx.pp or fx.pp == pp) and (not fx.dp or fx.dp == dp) and
                   B % dp == 0 and pp <= cfg.model.n_layers
        if ok then
          for _, mb in ipairs(divisors(B / dp)) do
            if mb > (opts.max_micro_batch or 16) then break end
            local scheds = pp > 1 and { "gpipe", "1f1b", "interleaved_1f1b" } or { "1f1b" }
            for _, sched in ipairs(scheds) do
              local vs = { 1 }
              if sched == "interleaved_1f1b" then
                vs = {}
                for _, v in ipairs(divisors(math.floor(cfg.model.n_layers / pp))) do
                  if v > 1 then vs[#vs + 1] = v end
                end
              end
              for _, v in ipairs(vs) do
                for _, zero in ipairs(dp * cp > 1 and { 0, 1 } or { 0 }) do
                  for _, sp in ipairs(tp > 1 and { false, true } or { false }) do
                    local lay = { tp = tp, cp = cp, dp = dp, pp = pp, v = v, zero = zero,
                                  sp = sp, micro_batch = mb, schedule = sched,
                                  recompute = opts.recompute or "none", fp8 = opts.fp8 }
                    if #layout_rules.problems(with_layout(cfg, lay), W) == 0 then
                      out[#out + 1] = lay
                    end
                  end
                end
              end
            end
          end
        end
      end
    end
  end
  return out
end

-- Evaluates every layout (M.layouts) and ranks them: those that fit first, then by
-- tokens/s (then by memory).
function M.search(cfg, cl, opts)
  local rows = {}
  for _, lay in ipairs(M.layouts(cfg, cl, opts)) do
    rows[#rows + 1] = M.evaluate(cfg, lay, cl)
  end
  table.sort(rows, function(a, b)
    if a.fits ~= b.fits then return a.fits end
    if math.abs(a.tokens_per_s - b.tokens_per_s) > 1e-9 * b.tokens_per_s then
      return a.tokens_per_s > b.tokens_per_s
    end
    return a.mem.total < b.mem.total
  end)
  return rows
end

-- -- Output ------------------------------------------------------------------------------

-- The `parallel.*` and `train.*` settings of record r, as --set key=value strings.
function M.settings(r)
  local s = {
    "parallel.data_parallel_size=" .. r.dp, "parallel.tensor_parallel_size=" .. r.tp,
    "parallel.pipeline_parallel_size=" .. r.pp, "parallel.context_parallel_size=" .. r.cp,
    "parallel.zero_stage=" .. r.zero_stage,
    "parallel.sequence_parallel=" .. tostring(r.sequence_parallel),
    "train.gradient_accumulation_steps=" .. r.grad_accum,
  }
  if r.pp > 1 then
    s[#s + 1] = "parallel.pipeline_schedule=" .. r.schedule
    if r.virtual > 1 then s[#s + 1] = "parallel.virtual_pipeline_size=" .. r.virtual end
  end
  return s
end

-- A YAML config for `tetra run` with cfg's model and batch and record r's layout.
function M.yaml(cfg, r, cl)
  local m, t = cfg.model, cfg.train
  local lines = {
    string.format("# tetra plan: %d ranks on %s", r.world, cl.name),
    string.format("# predicted: %.3f s/step, %.0f tokens/s, MFU %.1f%%, %.2f GiB per rank",
                  r.step_s, r.tokens_per_s, 100 * r.mfu, r.mem_gib),
    string.format("# run: mpirun -np %d tetra run THIS_FILE.yaml", r.world),
    "model:",
  }
  if not r.fits then
    table.insert(lines, 3, string.format("# WARNING: needs %.2f GiB per rank, more than the " ..
                                         "%.2f GiB a device has", r.mem_gib, cl.mem_bytes / 2 ^ 30))
  end
  local keys = {}
  for k in pairs(m) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v = m[k]
    if type(v) == "number" or type(v) == "boolean" or type(v) == "string" then
      lines[#lines + 1] = string.format("  %s: %s", k, tostring(v))
    end
  end
  lines[#lines + 1] = "train:"
  lines[#lines + 1] = "  recipe: " .. models.of(m).name
  lines[#lines + 1] = "  batch_size: " .. t.batch_size
  lines[#lines + 1] = "  gradient_accumulation_steps: " .. r.grad_accum
  lines[#lines + 1] = "  precision: " .. (cl.precision or t.precision or "fp32")
  lines[#lines + 1] = "parallel:"
  lines[#lines + 1] = "  data_parallel_size: " .. r.dp
  lines[#lines + 1] = "  tensor_parallel_size: " .. r.tp
  lines[#lines + 1] = "  pipeline_parallel_size: " .. r.pp
  lines[#lines + 1] = "  context_parallel_size: " .. r.cp
  lines[#lines + 1] = "  zero_stage: " .. r.zero_stage
  lines[#lines + 1] = "  sequence_parallel: " .. tostring(r.sequence_parallel)
  if r.pp > 1 then
    lines[#lines + 1] = "  pipeline_schedule: " .. r.schedule
    lines[#lines + 1] = "  virtual_pipeline_size: " .. r.virtual
  end
  return table.concat(lines, "\n") .. "\n"
end

return M
