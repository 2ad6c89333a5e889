-- tetra.planner.layouts: the layouts the planner weighs: a config's own, a config with
-- another layout in it, and every layout of a cluster that the layout rules accept.
local layout_rules = require("tetra.parallel.layout")

local M = {}

-- The layout fields of a config: sizes, zero stage, sequence parallelism, micro-batch,
-- schedule. lay: { tp, cp, dp, pp, v, zero, sp, micro_batch, schedule, recompute,
-- offload (parallel.offload_optimizer) }.
function M.layout_of(cfg)
  local p, s = cfg.parallel or {}, layout_rules.sizes(cfg)
  return { tp = s.tp, cp = s.cp, dp = s.dp, pp = s.pp, v = s.virtual,
           zero = p.zero_stage or 0, sp = p.sequence_parallel == true,
           micro_batch = s.micro_batch, schedule = p.pipeline_schedule or "1f1b",
           recompute = (cfg.train or {}).recompute or "none",
           offload = p.offload_optimizer == true }
end

-- cfg with lay's sizes in it (a copy of the parallel and train sections).
function M.with_layout(cfg, lay)
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  c.parallel, c.train = {}, {}
  for k, v in pairs(cfg.parallel or {}) do c.parallel[k] = v end
  for k, v in pairs(cfg.train or {}) do c.train[k] = v end
  local p = c.parallel
  for dim, key in pairs(layout_rules.size_keys) do p[key] = lay[dim] end
  p.zero_stage, p.sequence_parallel = lay.zero, lay.sp
  p.pipeline_schedule, p.virtual_pipeline_size = lay.schedule, lay.v
  if lay.offload ~= nil then p.offload_optimizer = lay.offload end
  c.train.gradient_accumulation_steps = c.train.batch_size / (lay.dp * lay.micro_batch)
  c.train.micro_batch_size = nil
  if lay.recompute == "none" or lay.recompute == "selective" or lay.recompute == "full" then
    c.train.recompute = lay.recompute
  end
  return c
end

-- n's divisors, smallest first, found in pairs up to sqrt(n): a batch of 1e12 rows is a
-- million trials, not a trillion.
function M.divisors(n)
  local small, large = {}, {}
  local i = 1
  while i * i <= n do
    if n % i == 0 then
      small[#small + 1] = i
      if i * i ~= n then large[#large + 1] = n / i end
    end
    i = i + 1
  end
  for j = #large, 1, -1 do small[#small + 1] = large[j] end
  return small
end
local divisors = M.divisors

-- Every layout of cl.devices ranks for cfg that the layout rules accept (tensor
-- parallelism within a node), each micro-batch size, ZeRO-1 on and off, sequence
-- parallelism on and off, each pipeline schedule. opts.fixed: { tp =, pp =, dp =, cp = }
-- sizes to keep; opts.max_micro_batch: the largest micro-batch tried (16);
-- activation recompute none, selective and full (train.recompute, what the engine does),
-- or only opts.recompute (one of those, or "selective_op": torchtitan's per-op policy,
-- priced only to compare published runs that used it); opts.fp8: FP8 matmuls.
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
                for _, zero in ipairs(dp * cp > 1 and { 0, 1, 2, 3 } or { 0 }) do
                  for _, sp in ipairs(tp > 1 and { false, true } or { false }) do
                    for _, rc in ipairs(opts.recompute and { opts.recompute }
                                        or { "none", "selective", "full" }) do
                      local lay = { tp = tp, cp = cp, dp = dp, pp = pp, v = v, zero = zero,
                                    sp = sp, micro_batch = mb, schedule = sched,
                                    recompute = rc, fp8 = opts.fp8 }
                      if #layout_rules.problems(M.with_layout(cfg, lay), W) == 0 then
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
  end
  return out
end

return M
