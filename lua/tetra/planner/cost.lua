-- tetra.planner.cost: the price of one layout, in the phases of a step: the shapes one
-- rank works with, the activations a micro-batch keeps, the chunks' times, the schedule's
-- replay (tetra.planner.schedule), each stage's memory and optimizer/data-parallel time,
-- and the step's summary.
local layout_rules = require("tetra.parallel.layout")
local models = require("tetra.models")
local errors = require("tetra.util.errors")
local model = require("tetra.planner.model")
local layouts = require("tetra.planner.layouts")
local schedule = require("tetra.planner.schedule")

local M = {}

-- A ring collective over `n` ranks moving `bytes` (the whole tensor): all-reduce moves
-- 2 (n-1)/n of it per rank, all-gather and reduce-scatter (n-1)/n.
local function ring(kind, bytes, n, bw, lat)
  if n <= 1 or bytes <= 0 then return 0 end
  local f = kind == "all_reduce" and 2 * (n - 1) / n or (n - 1) / n
  local steps = kind == "all_reduce" and 2 * (n - 1) or (n - 1)
  return f * bytes / bw + steps * lat
end

-- The link a group uses, its bandwidth and its latency per collective step: inside a node
-- when it spans no more than one node's devices (the mesh order is tp, cp, dp, pp,
-- tensor fastest), else between nodes.
local function link(cl, stride, size)
  if stride * size <= cl.devices_per_node then return cl.intra_bw, cl.latency_s end
  return cl.inter_bw, cl.inter_latency_s
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
    errors.raise("cluster.elementwise = eager is counted for the %s family only, not '%s'; " ..
                 "leave it unset for fused elementwise kernels", table.concat(counted, ", "),
                 tostring(m.family))
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

-- The sizes one rank works with for layout `lay`: the model's (T, d, f, V, L, H, hd, kv),
-- the layout's (tp, cp, pp, v, mb), one micro-batch's tokens on this rank (n; seq_n in
-- the residual stream, split by sequence parallelism) and the heads and features a tp
-- rank holds (Hl, kvl, fl).
local function shape(cfg, lay)
  local m = cfg.model
  local sizes = layout_rules.sizes(layouts.with_layout(cfg, lay))
  local x = { m = m, W = sizes.world, n_micro = sizes.micro_batches,
              T = m.seq_len, d = m.dim, f = m.ffn_hidden, V = m.vocab_size, L = m.n_layers,
              H = m.n_heads, tp = lay.tp, cp = lay.cp, pp = lay.pp, v = lay.v,
              mb = lay.micro_batch, block = models.of(m).block }
  x.hd = x.d / x.H
  x.kv = m.n_kv_heads or x.H
  x.n = x.mb * x.T / x.cp                        -- tokens of one micro-batch on this rank
  x.seq_n = lay.sp and x.n / x.tp or x.n         -- the residual stream's tokens
  x.Hl = x.H / x.tp
  x.kvl = x.kv >= x.tp and x.kv / x.tp or 1
  x.fl = x.f / x.tp
  x.Vl = math.ceil(x.V / x.tp)
  return x
end

-- The bytes of activations one micro-batch leaves for backward: per block, the first
-- stage's embedding output, a later stage's received input, the last stage's head, and
-- what exists at once when backward starts at the head.
local function activation_bytes(x, lay, act_b, per_projection)
  local m, T, d, f, V, L = x.m, x.T, x.d, x.f, x.V, x.L
  local hd, tp, cp, pp, v, mb = x.hd, x.tp, x.cp, x.pp, x.v, x.mb
  local n, seq_n, Hl, kvl, fl, Vl, block = x.n, x.seq_n, x.Hl, x.kvl, x.fl, x.Vl, x.block
  -- Activations. The autograd tape holds every op's inputs and output until backward
  -- (engine/core/autograd.c: tt_record retains both), so a micro-batch in flight costs every
  -- tensor its forward made; views share storage and cost nothing. Under tensor
  -- parallelism a column-parallel linear reads its input through copy_to_group (a view)
  -- or, under sequence parallelism, a gather of it (sp_gather: one for the linears that
  -- read one x, nn.linears; one per projection in fp8, `per_projection`), and each
  -- row-parallel output is summed into a new tensor. Element counts, one entry per
  -- tensor, of one block:
  local nd, nds = n * d, seq_n * d           -- whole sequence; the residual stream
  local stats = block.layer_norm and 2 * seq_n or seq_n   -- LayerNorm: mean, 1/std; RMSNorm: 1/rms
  local tensors = {}
  local function keep(e) tensors[#tensors + 1] = e end
  if lay.recompute == "full" then
    keep(nds)                                   -- only the block's input is kept
  elseif lay.recompute == "selective" then
    -- Tetra's (tetra.nn.recompute): the block's input and a copy of every GEMM's output;
    -- norms, RoPE, attention's core, the MLP activation and the residuals are re-run.
    keep(nds)
    for _, mm in ipairs(model.block_matmuls(m, tp)) do keep(n * mm.out) end
  elseif lay.recompute == "selective_op" then
    -- torchtitan's per-op policy (block_time below): the block's input, every odd
    -- matmul's output, attention's output and log-sum-exp; the rest is recomputed.
    keep(nds)
    for i, mm in ipairs(model.block_matmuls(m, tp)) do
      if i % 2 == 1 then keep(n * mm.out) end
    end
    keep(n * Hl * hd); keep(n * Hl)
  else
    keep(nds); keep(stats)                      -- norm 1
    if tp > 1 and lay.sp then                   -- wq, wk, wv input, gathered
      for _ = 1, per_projection and 3 or 1 do keep(nd) end
    end
    keep(n * Hl * hd)                           -- wq (RoPE rotates it in place)
    keep(n * kvl * hd)                          -- wk (the same)
    keep(n * kvl * hd)                          -- wv
    if cp > 1 then keep(mb * T * kvl * hd); keep(mb * T * kvl * hd) end  -- k, v gathered
    keep(n * Hl * hd); keep(n * Hl)             -- attention output, log-sum-exp
    keep(tp > 1 and nd or nds)                  -- wo (partial sums under tp)
    if tp > 1 then keep(nds); if block.out_bias then keep(nds) end end   -- summed (+ bias)
    keep(nds)                                   -- residual
    keep(nds); keep(stats)                      -- norm 2
    if tp > 1 and lay.sp then                   -- MLP input, gathered
      keep(nd); if per_projection and block.gated_mlp then keep(nd) end
    end
    keep(n * fl); keep(n * fl)                  -- w1, w3 (c_fc, gelu)
    if block.gated_mlp then keep(n * fl) end    -- swiglu
    keep(tp > 1 and nd or nds)                  -- w2 (partial sums under tp)
    if tp > 1 then keep(nds); if block.out_bias then keep(nds) end end
    keep(nds)                                   -- residual: the block's output
  end
  local block_act = 0
  for _, e in ipairs(tensors) do block_act = block_act + model.granted(e * act_b) end
  -- The first stage's embedding output (the vocab-parallel one's partial sums and their
  -- sum; learned positions added to it); a later stage's received activations instead.
  local embed_act = model.granted(nds * act_b)
  if tp > 1 then embed_act = embed_act + model.granted(nd * act_b) end
  if block.learned_positions then embed_act = embed_act + 2 * model.granted(nds * act_b) end
  local recv_act = model.granted(nds * act_b)
  -- The last stage's head: final norm, the head's input gathered under sp, the logits.
  local head_act = model.granted(nds * act_b) + model.granted(stats * act_b) +
                   (tp > 1 and lay.sp and model.granted(nd * act_b) or 0) +
                   model.granted(n * Vl * 4)
  -- When backward starts: the logits' gradient, the head weight's gradient and the
  -- gradient of its input exist at once. The weight's gradient is a new tensor only when
  -- the weight has none yet: a later micro-batch's GEMM adds into the one there (beta = 1).
  local head_peak = model.granted(n * Vl * 4) + model.granted(nd * act_b)
  local head_wgrad = model.granted(Vl * d * 4)

  return { block = block_act, embed = embed_act, recv = recv_act, head = head_act,
           head_peak = head_peak, head_wgrad = head_wgrad }
end

-- Per-chunk times of one micro-batch on every stage: forward fwd[s][c], backward
-- bwd[s][c] (communication included), the blocking communication comm_mb[s] of one
-- micro-batch, and the transfer time between two stages.
local function chunk_times(x, lay, cl, act_b)
  local m, T, d, f, V, L = x.m, x.T, x.d, x.f, x.V, x.L
  local hd, tp, cp, pp, v, mb = x.hd, x.tp, x.cp, x.pp, x.v, x.mb
  local n, seq_n, Hl, kvl, fl, Vl, block = x.n, x.seq_n, x.Hl, x.kvl, x.fl, x.Vl, x.block
  -- Per-chunk times of one micro-batch.
  local rate_mm = cl.peak_flops * cl.matmul * cl.sustained
  local rate_mm8 = (lay.fp8 and cl.fp8_flops or cl.peak_flops) * cl.matmul * cl.sustained
  local rate_at = cl.peak_flops * cl.attention * cl.sustained
  local rate_bw = cl.mem_bw * cl.sustained
  local block_w, head_w = model.matmul_params(m, tp)
  local rerun_w = 0                             -- every second matmul's weights
  for i, mm in ipairs(model.block_matmuls(m, tp)) do
    if i % 2 == 0 then rerun_w = rerun_w + mm.weights end
  end
  local bw_tp, lat_tp = link(cl, 1, tp)
  local function block_time()
    local mm = 2 * n * block_w / rate_mm8
    local at = 2 * n * T * d / tp / rate_at             -- 4 n (T/2) hd Hl: causal half
    local ew_bytes = cl.elementwise == "eager" and eager_block_bytes(m, n, Hl, kvl, fl, act_b)
                     or (10 * seq_n * d + 2 * n * (Hl + kvl) * hd + 3 * n * fl) * act_b
    local ew = ew_bytes / rate_bw
    local fwd, bwd = mm + at + ew, 2 * mm + 2.5 * at + 2 * ew
    -- Recompute: full reruns the block's forward in backward; selective (Tetra's) all
    -- of it but the GEMMs, whose outputs it kept. selective_op is torchtitan's
    -- per-op policy (selective_ac_option = "op"; `_save_list` and `_custom_policy` in
    -- torchtitan/parallelisms/parallelize_llama.py at the benchmarks' commit 9dec370):
    -- it saves the outputs of matmuls and attention except every second matmul of the
    -- block, counted in forward order, so backward reruns those (wk, wo and w3 in a
    -- Llama block: 37% of its matmul FLOPs) and every elementwise op. Rerun FLOPs cost
    -- time but are not model FLOPs (MFU does not count them).
    if lay.recompute == "full" then bwd = bwd + mm + at + ew
    elseif lay.recompute == "selective" then bwd = bwd + at + ew
    elseif lay.recompute == "selective_op" then bwd = bwd + 2 * n * rerun_w / rate_mm8 + ew end
    local comm_f, comm_b = 0, 0
    if tp > 1 then
      local kind = lay.sp and "all_gather" or "all_reduce"
      local one = ring(kind, n * d * act_b, tp, bw_tp, lat_tp)
      if lay.sp then one = one + ring("reduce_scatter", n * d * act_b, tp, bw_tp, lat_tp) end
      comm_f, comm_b = 2 * one, 2 * one
    end
    if cp > 1 then
      local bw_cp, lat_cp = link(cl, tp, cp)
      local kvbytes = 2 * mb * T * kvl * hd * act_b
      comm_f = comm_f + ring("all_gather", kvbytes, cp, bw_cp, lat_cp)
      comm_b = comm_b + ring("reduce_scatter", kvbytes * 4 / act_b, cp, bw_cp, lat_cp)
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
  local head_comm = tp > 1 and 2 * ring("all_reduce", n * 4 * 3, tp, bw_tp, lat_tp) +
                    cl.sync_wait * (head_f + head_b) or 0
  local embed_comm = tp > 1 and ring("all_reduce", n * d * act_b, tp, bw_tp, lat_tp) or 0

  local fwd, bwd, comm_mb = {}, {}, {}
  for s = 0, pp - 1 do
    fwd[s], bwd[s], comm_mb[s] = {}, {}, 0
    for c, b in ipairs(model.stage_blocks(L, pp, v, s)) do
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
  local bw_pp, lat_pp = link(cl, lay.tp * lay.cp * lay.dp, pp)
  local hop = pp > 1 and (seq_n * d * act_b / bw_pp + lat_pp) or 0

  return fwd, bwd, comm_mb, hop
end

-- Per stage: parameters, optimizer state, buffers and activations at the peak (held:
-- the micro-batches each chunk holds at once, from the schedule replay), and the
-- optimizer's and the data-parallel reduction's time after the last backward.
local function stage_costs(cfg, x, lay, cl, acts, bwd, fwd, busy, held, comm_mb)
  local m, L, cp, pp, v, n_micro = x.m, x.L, x.cp, x.pp, x.v, x.n_micro
  local _, par_b, grad_b = widths(cl.precision)
  local rate_bw = cl.mem_bw * cl.sustained
  local tp = lay.tp
  -- Per stage: parameters, optimizer state, buffers, activations; then the optimizer
  -- and data-parallel time of the slowest stage.
  local group = lay.dp * cp                      -- gradients average over dp x cp
  local bw_dp, lat_dp = link(cl, tp, group)
  local stages = {}
  for s = 0, pp - 1 do
    local elems, per_block = model.rank_params(m, lay, s, 0)
    local pbytes, gbytes, nparams = 0, 0, 0
    for _, e in ipairs(elems) do
      pbytes = pbytes + model.granted(e * par_b)
      gbytes = gbytes + model.granted(e * grad_b)
      nparams = nparams + e
    end
    local zero = lay.zero >= 1 and group > 1
    local zero2 = zero and lay.zero >= 2
    local zero3 = zero and lay.zero == 3
    -- ZeRO-3 (parallel/data.lua): the parameters outside the blocks whole, this rank's
    -- f32 share of every parameter (each block a unit padded to the group), and at most
    -- two blocks gathered (the one running and the next, prefetched): in bf16 / fp16 only
    -- their low-precision copies (gathered in that width), in fp32 and fp8 the f32
    -- parameters (and fp8's copies, as par_b counts them). Twice per block and micro-batch.
    local lowp_gather = cl.precision == "bf16" or cl.precision == "fp16"
    local gather_b = lowp_gather and 2 or par_b
    local block_elems, biggest, n_blocks, owned_b = 0, 0, 0, 0
    if zero3 then
      local root = nparams
      for _, e in pairs(per_block) do
        block_elems, n_blocks = block_elems + e, n_blocks + 1
        biggest = math.max(biggest, e)
        root = root - e
        owned_b = owned_b + model.granted(math.ceil(e / group) * 4)
      end
      owned_b = owned_b + model.granted(math.ceil(root / group) * 4)
      pbytes = model.granted(root * par_b) + owned_b + 2 * model.granted(biggest * gather_b)
    end
    local padded = math.ceil(nparams / group) * group
    local obytes, cbytes
    local whole_gbytes = gbytes   -- the whole gradients, while they are there
    if zero2 then
      -- ZeRO-2: no bucket buffers between steps; the gradients kept are the 1/group share.
      obytes = 2 * model.granted(padded / group * 4)
      gbytes = model.granted(padded / group * grad_b)
      cbytes = 0
    elseif zero then
      obytes = 2 * model.granted(padded / group * 4)
      cbytes = model.granted(padded * 4) + model.granted(padded / group * 4)
    else
      obytes = 0
      for _, e in ipairs(elems) do obytes = obytes + 2 * model.granted(e * 4) end
      cbytes = group > 1 and model.granted(nparams * 4) or 0
    end
    -- The peak: every micro-batch this stage holds at once (the schedule replay), and
    -- when backward starts the head's gradients (last stage) or the received gradient;
    -- the parameters' gradients are there already once an earlier micro-batch's
    -- backward ran (several micro-batches), else they grow while activations go.
    local act = 0
    for c, b in ipairs(model.stage_blocks(L, pp, v, s)) do
      local nb = b[2] - b[1] + 1
      local vs = (c - 1) * pp + s
      local per = nb * acts.block + (vs == 0 and acts.embed or acts.recv)
      if vs == pp * v - 1 then per = per + acts.head end
      act = act + held[s][c - 1] * per
    end
    local at_head = acts.head_peak + (n_micro == 1 and acts.head_wgrad or 0)
    act = act + (s == pp - 1 and at_head or acts.recv)
    local at_peak = pbytes + obytes + cbytes +
                    (n_micro > 1 and gbytes + act or math.max(act, gbytes + at_head))
    -- ZeRO-2: the share is there all along; earlier micro-batches accumulate whole
    -- gradients (there at the last one's peak), while with one micro-batch each whole
    -- gradient is released as soon as backward made it (its bucket in flight left out).
    if zero2 then
      at_peak = pbytes + obytes + gbytes +
                (n_micro > 1 and whole_gbytes + act or math.max(act, at_head))
    end
    -- The optimizer: AdamW reads param, grad, m, v and writes param, m, v (fp32).
    local opt_elems = zero and padded / group or nparams
    local t_opt = 28 * opt_elems / rate_bw
    -- Offloaded (parallel.offload_optimizer): the moments are host memory, off the
    -- device's peak; the update moves each parameter and gradient to the host and the
    -- parameter back (12 bytes an element over cl.offload_bw) and runs at the host's
    -- cl.host_bw (the same 28 bytes an element). Under bf16 / fp16
    -- the f32 masters stay on the host through forward and backward
    -- (AdamW:masters_on_host), and the update downloads none of those the host keeps: 8
    -- bytes an element of them moved, not 12. Stages 0 to 2: the matrices' masters, 4
    -- bytes an element of the whole matrices off the peak; the host keeps them whole or
    -- (ZeRO-1 and 2) this rank's 1/group share. ZeRO-3: every share (owned_b) off the
    -- peak, less the bf16 / fp16 copy of each block's share its gathers send meanwhile
    -- and the block's f32 parameters (norm weights) whole in f32 (engine/dist/reducer.c's
    -- shares_away).
    local host_masters, released_b = 0, 0
    if lay.offload and lowp_gather then
      local block_mm, head_mm = model.matmul_params(m, tp)
      if zero3 then
        released_b = owned_b
        for _, e in pairs(per_block) do
          released_b = released_b - model.granted(math.ceil(e / group) * 2)
          if e > block_mm then released_b = released_b - model.granted((e - block_mm) * 4) end
        end
        host_masters = padded / group
      else
        local masters = 0
        for _ in pairs(per_block) do masters = masters + block_mm end
        if s == pp - 1 and not model.tied(m) then masters = masters + head_mm end
        host_masters = zero and masters / group or masters
        released_b = 4 * masters
      end
    end
    if lay.offload then
      if not cl.host_is_device then   -- on the cpu cluster the host is the device
        at_peak = at_peak - obytes - released_b
        obytes = 0
      end
      local t_host = 28 * opt_elems / (cl.host_bw or cl.mem_bw)
      -- Whole weights (no ZeRO shards): the host update runs while the next step's first
      -- forward does (AdamW:overlap_with), so only what outlasts that forward shows; the
      -- copies stay exposed (the gradients come down before it starts, each weight goes
      -- up on the compute stream as the forward reaches it).
      if not zero then t_host = math.max(0, t_host - fwd[s][0]) end
      t_opt = (12 * opt_elems - 4 * host_masters) / (cl.offload_bw or cl.mem_bw) + t_host
    end
    -- Gradients are reduced (and ZeRO-1 and 2's parameters gathered) in fp32 by Tetra;
    -- cl.dp_bytes overrides that for engines that reduce in bf16.
    local dp_b = cl.dp_bytes or 4
    local grad_bytes = nparams * dp_b
    local t_dp, t_ag = 0, 0
    if group > 1 then
      local kind = zero and "reduce_scatter" or "all_reduce"
      local total = ring(kind, grad_bytes, group, bw_dp, lat_dp)
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
        last = ring(kind, math.min(grad_bytes, cap), group, bw_dp, lat_dp)
      elseif first <= tail then
        last = ring(kind, tail, group, bw_dp, lat_dp)
      else
        last = ring(kind, first, group, bw_dp, lat_dp)
        local rest = nparams - elems[1]
        if s == 0 and rest > 0 and (cfg.dist or {}).defer_weight_grads ~= false then
          local hide = 0.5 * hidden * math.min(elems[1], rest / 2) / rest
          last = math.max(ring(kind, tail, group, bw_dp, lat_dp), last - hide)
        end
      end
      t_dp = math.max(last, total - hidden)
      if zero3 then
        -- After the step only the units outside the blocks are gathered again; each
        -- block is gathered (in bf16 / fp16 under those precisions, else f32: dp_b)
        -- twice per micro-batch. Tetra starts each
        -- block's gather while the block before it runs, but MPI moves a non-blocking
        -- collective only inside MPI calls, which forward makes none of: measured, the
        -- gathers are exposed whole (tools/bench/plan.sh), and so they are priced. An
        -- engine that overlaps them (cl.overlap_param_gather) waits whole for the first
        -- of each pass only, and for what the stage's compute does not cover.
        t_ag = ring("all_gather", (nparams - block_elems) * dp_b, group, bw_dp, lat_dp)
        if n_blocks > 0 then
          local one = ring("all_gather", block_elems / n_blocks * (lowp_gather and 2 or dp_b),
                           group, bw_dp, lat_dp)
          local all = 2 * n_micro * n_blocks * one
          if cl.overlap_param_gather then
            all = 2 * n_micro * one + math.max(0, all - 2 * n_micro * one - busy[s])
          end
          t_ag = t_ag + all
        end
      elseif zero then
        t_ag = ring("all_gather", padded * dp_b, group, bw_dp, lat_dp)
        -- Gathered while the next step's first forward runs (cl.overlap_param_gather).
        if cl.overlap_param_gather then t_ag = math.max(0, t_ag - fwd[s][0]) end
      end
    end
    local st = { params = pbytes, grads = gbytes, optimizer = obytes, comm = cbytes,
                 activations = act, t_opt = t_opt, t_dp = t_dp + t_ag, busy = busy[s],
                 comm_mb = comm_mb[s], n_params = nparams,
                 host_masters = (lay.offload and not cl.host_is_device) and 4 * host_masters or 0,
                 released_masters = (lay.offload and not cl.host_is_device) and released_b or 0 }
    st.total = at_peak
    stages[s + 1] = st
  end
  return stages
end

-- Evaluates layout `lay` for cfg on cluster cl: a record with the layout, memory (bytes,
-- the largest rank and rank 0), time (seconds) and throughput.
function M.evaluate(cfg, lay, cl)
  local x = shape(cfg, lay)
  local act_b = widths(cl.precision)
  local acts = activation_bytes(x, lay, act_b, cl.precision == "fp8")
  local fwd, bwd, comm_mb, hop = chunk_times(x, lay, cl, act_b)
  local span, busy, held = schedule.replay(lay, x.n_micro, fwd, bwd, hop)
  local stages = stage_costs(cfg, x, lay, cl, acts, bwd, fwd, busy, held, comm_mb)
  local m, t, T, W, n_micro = x.m, cfg.train, x.T, x.W, x.n_micro
  local tp, pp, cp, v, mb = x.tp, x.pp, x.cp, x.v, x.mb
  local worst, worst_s = nil, 0
  for s, st in ipairs(stages) do
    if not worst or st.total > worst.total then worst, worst_s = st, s - 1 end
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
  -- Against the dense peak of the precision the GEMMs run in, as tetra.obs.mfu measures
  -- it in a run: FP8's under fp8.
  local peak = lay.fp8 and cl.fp8_flops or cl.peak_flops
  local mfu = tps * model.flops_per_token(m) / (W * peak)
  local r0 = stages[1]
  return {
    dp = lay.dp, tp = tp, pp = pp, cp = cp, zero_stage = lay.zero, sequence_parallel = lay.sp,
    micro_batch = mb, grad_accum = n_micro, schedule = pp > 1 and lay.schedule or "-",
    virtual = v, recompute = lay.recompute, offload = lay.offload, world = W,
    mem = { params = worst.params, grads = worst.grads, optimizer = worst.optimizer,
            activations = worst.activations, comm = worst.comm, total = worst.total,
            host_masters = worst.host_masters, released_masters = worst.released_masters,
            stage = worst_s },
    mem_rank0 = r0.total,
    mem_gib = worst.total / 2 ^ 30,
    fits = worst.total <= cl.mem_bytes,
    step_s = step, compute_s = compute, exposed_comm_s = exposed, bubble_s = bubble,
    tokens_per_s = tps, tokens_per_s_per_device = tps / W, mfu = mfu,
  }
end


return M
