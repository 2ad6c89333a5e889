-- tetra plan: every parallel layout of a model on a cluster, with each rank's memory and the
-- predicted step time, tokens/s and MFU, best first (lua/tetra/planner/init.lua does the sums).
--
--   tetra plan [FILE] [--model NAME] [--set k=v]... [--batch N] [--cluster NAME] [options]
local config = require("tetra.config")
local plan = require("tetra.planner")

local M = {}

M.usage = [[
usage: tetra plan [FILE] [--model NAME] [--set key=value]... [--batch N] [--cluster NAME]
                  [--nodes N] [--devices-per-node N] [--peak-tflops X] [--mem-gib X]
                  [--mem-bw-gbs X] [--intra-gbs X] [--inter-gbs X] [--latency-us X]
                  [--inter-gbps X] [--inter-latency-us X] [--sustained X] [--sync-wait X]
                  [--tp N] [--pp N] [--dp N] [--cp N] [--top K | --all] [--json]
                  [--write FILE] [--pick N]
       tetra plan --published
  FILE            a recipe (.lua) or YAML config giving the model (default recipes/llama.lua)
  --model NAME    a model preset (train.model_name): llama-7b, llama3-8b, gpt2-124m, ...
  --batch N       global batch in sequences (train.batch_size)
  --cluster NAME  h100, h200 (8-GPU nodes, NVLink, 400 Gb/s InfiniBand), h100_500w
                  (torchtitan's 96 GB HBM2e H100 at 500 W) or cpu (this machine, one
                  rank per core: its GEMM, copy and all-reduce rates measured here the
                  first time, about 10 s, and cached per machine); default cpu
  --measure       measure this machine's cpu rates again (the cache is replaced)
  --preset-rates  the cpu cluster's preset figures instead of this machine's
  --nodes N, --devices-per-node N, --peak-tflops X, --mem-gib X, --mem-bw-gbs X,
  --intra-gbs X, --inter-gbs X, --latency-us X, --sustained X   override the cluster's
                  figures (GB/s per device; sustained: the share of the kernel rates a
                  whole step reaches)
  --inter-gbps X, --inter-latency-us X   this cluster's links between nodes: Gbit/s per
                  device (as a network's rate is given; --inter-gbs in GB/s is the same
                  figure, give one) and the latency of a collective step between nodes
                  (default --latency-us, which prices both kinds of link)
  --sync-wait X   what a blocking tensor- or context-parallel collective costs in waiting
                  for the last rank to arrive, as a share of the computation since the
                  previous one (default 0; tools/bench/plan.sh measures this machine's)
  --tp/--pp/--dp/--cp N  only layouts with that size
  Every layout is weighed with each activation recompute (train.recompute none, selective
  and full; the rc column), ZeRO 0, 1, 2 and 3, sequence parallelism on and off; on a
  GPU cluster a layout that does not fit is weighed again with optimizer offload (the
  AdamW moments in host memory), listed as zero "N+o" when that fits.
  --top K         print the best K layouts (default 15); --all prints every one
  --json          a JSON list of objects instead of the table
  --write FILE    write the best layout (or --pick N, 1-based) as YAML for `tetra run`
  --published     the planner against published runs (Megatron-LM, torchtitan on H100):
                  each row's published figure beside the prediction (docs/planner.md)
]]

local usage_error = require("tetra.util.errors").usage("tetra plan", "see tetra plan --help")

-- Parses a positive number option value; nil and a message if it is not one.
local function number(opt, v)
  local x = tonumber(v or "")
  if not x or x <= 0 then return nil, opt .. " needs a positive number, got '" .. tostring(v) .. "'" end
  return x
end

-- Parses argv; returns opts or nil, message.
function M.parse(args)
  local o = { sets = {}, cluster = "cpu", over = {}, fixed = {}, top = 15 }
  local set_by = {}   -- cluster field -> the option that set it
  local i = 1
  local overrides = {
    ["--nodes"] = { "nodes", 1 }, ["--devices-per-node"] = { "devices_per_node", 1 },
    ["--peak-tflops"] = { "peak_flops", 1e12 }, ["--mem-gib"] = { "mem_bytes", 2 ^ 30 },
    ["--mem-bw-gbs"] = { "mem_bw", 1e9 }, ["--intra-gbs"] = { "intra_bw", 1e9 },
    ["--inter-gbs"] = { "inter_bw", 1e9 }, ["--latency-us"] = { "latency_s", 1e-6 },
    ["--inter-gbps"] = { "inter_bw", 1e9 / 8 },
    ["--inter-latency-us"] = { "inter_latency_s", 1e-6 },
    ["--sustained"] = { "sustained", 1 }, ["--sync-wait"] = { "sync_wait", 1, zero = true },
  }
  while i <= #args do
    local a = args[i]
    local function value()
      i = i + 1
      if args[i] == nil then return nil end
      return args[i]
    end
    if a == "--help" or a == "-h" then o.help = true
    elseif a == "--json" then o.json = true
    elseif a == "--all" then o.all = true
    elseif a == "--published" then o.published = true
    elseif a == "--set" then
      local kv = value()
      if not kv then return nil, "--set needs key=value" end
      o.sets[#o.sets + 1] = kv
    elseif a == "--model" then
      local v = value()
      if not v then return nil, "--model needs a preset name" end
      o.sets[#o.sets + 1] = "train.model_name=" .. v
    elseif a == "--batch" then
      local v, err = number(a, value())
      if not v then return nil, err end
      o.sets[#o.sets + 1] = "train.batch_size=" .. math.floor(v)
    elseif a == "--cluster" then
      o.cluster = value()
      if not o.cluster then return nil, "--cluster needs a name (h100, h200, cpu)" end
    elseif a == "--preset-rates" then
      o.preset_rates = true
    elseif a == "--measure" then
      o.measure = true
    elseif overrides[a] then
      local raw = value()
      local v, err
      if overrides[a].zero then   -- 0 is a value here (--sync-wait)
        v = tonumber(raw or "")
        if not v or v < 0 then
          v, err = nil, a .. " needs a number of 0 or more, got '" .. tostring(raw) .. "'"
        end
      else
        v, err = number(a, raw)
      end
      if not v then return nil, err end
      local field = overrides[a][1]
      if set_by[field] and set_by[field] ~= a then
        return nil, a .. " and " .. set_by[field] .. " both set the same figure: give one"
      end
      set_by[field] = a
      o.over[field] = v * overrides[a][2]
    elseif a == "--tp" or a == "--pp" or a == "--dp" or a == "--cp" then
      local v, err = number(a, value())
      if not v then return nil, err end
      o.fixed[a:sub(3)] = math.floor(v)
    elseif a == "--top" or a == "--pick" then
      local v, err = number(a, value())
      if not v then return nil, err end
      o[a:sub(3)] = math.floor(v)
    elseif a == "--write" then
      o.write = value()
      if not o.write then return nil, "--write needs a file name" end
    elseif a:sub(1, 1) == "-" then
      return nil, "unknown option '" .. a .. "'"
    elseif o.file then
      return nil, "unexpected argument '" .. a .. "' (one model FILE at most)"
    else
      o.file = a
    end
    i = i + 1
  end
  return o
end

-- The config of FILE (or recipes/llama.lua) with the --set values, not checked against a
-- world size (the plan chooses one).
function M.load_config(file, sets)
  file = file or (require("tetra.host").root .. "/recipes/llama.lua")
  local f = io.open(file)
  if not f then config.error("%s does not exist", file) end
  f:close()
  local recipe, cfg
  if file:match("%.ya?ml$") then
    recipe, cfg = config.load(file, sets, { world_size = false })
  else
    local chunk, err = loadfile(file)
    if not chunk then config.error("%s", err) end
    recipe = chunk()
    if type(recipe) ~= "table" or not recipe.defaults then
      config.error("%s is not a recipe (it returns no train.recipe table)", file)
    end
    cfg = config.build({ defaults = recipe.defaults, sets = sets, world_size = false })
  end
  -- The model's family (its parameter shapes): a preset names it; else the recipe's model.
  if not cfg.model.family then
    local models = require("tetra.models")
    cfg.model.family = recipe and models.family_of(recipe.Model) or models.default
  end
  return cfg
end

local function gib(b) return b / 2 ^ 30 end

-- 6.74B, 5.2M, ...
local function count_text(n)
  if n >= 1e9 then return string.format("%.2fB", n / 1e9) end
  return string.format("%.1fM", n / 1e6)
end

-- The table of rows (records of tetra.planner.evaluate).
function M.table(rows, cl, cfg)
  local out = {}
  local m = cfg.model
  out[#out + 1] = string.format(
    "# %s: %d devices; model %s (%s parameters, dim %d, %d layers, seq %d), batch %d " ..
    "sequences, %s", cl.name, cl.devices, cfg.train.model_name or m.family or "llama",
    count_text(plan.parameter_count(m)), m.dim, m.n_layers, m.seq_len, cfg.train.batch_size,
    cl.precision == "fp8" and "fp8 (its GEMMs at the FP8 rate, MFU against the FP8 peak)" or
      cl.precision or "fp32")
  if cl.nodes > 1 then
    out[#out + 1] = string.format("# links: %g GB/s and %g us inside a node, %g Gbit/s and " ..
      "%g us between nodes (per device)", cl.intra_bw / 1e9, cl.latency_s * 1e6,
      cl.inter_bw * 8 / 1e9, cl.inter_latency_s * 1e6)
  end
  local fmt = "%4s %4s %3s %3s %3s %4s %3s %4s %4s %6s %-12s %9s %8s %8s %8s %8s %8s %8s %8s %8s %8s %12s %6s %s"
  local rc_short = { none = "-", full = "full", selective = "sel", selective_op = "op" }
  out[#out + 1] = string.format(fmt, "rank", "dp", "tp", "pp", "cp", "zero", "sp", "rc", "mb",
    "accum", "schedule", "mem GiB", "params", "grads", "optim", "acts", "comm", "step s",
    "compute", "exp.comm", "bubble", "tokens/s", "MFU", "fits")
  for i, r in ipairs(rows) do
    local sched = r.schedule
    if r.virtual > 1 then sched = sched .. "/v" .. r.virtual end
    out[#out + 1] = string.format(fmt, i, r.dp, r.tp, r.pp, r.cp,
      r.zero_stage .. (r.offload and "+o" or ""),
      r.sequence_parallel and "y" or "-", rc_short[r.recompute] or r.recompute,
      r.micro_batch, r.grad_accum, sched,
      string.format("%.3f", r.mem_gib), string.format("%.3f", gib(r.mem.params)),
      string.format("%.3f", gib(r.mem.grads)), string.format("%.3f", gib(r.mem.optimizer)),
      string.format("%.3f", gib(r.mem.activations)), string.format("%.3f", gib(r.mem.comm)),
      string.format("%.4g", r.step_s), string.format("%.4g", r.compute_s),
      string.format("%.4g", r.exposed_comm_s), string.format("%.4g", r.bubble_s),
      string.format("%.0f", r.tokens_per_s), string.format("%.1f%%", 100 * r.mfu),
      r.fits and "yes" or "NO")
  end
  return table.concat(out, "\n") .. "\n"
end

-- The rows as a JSON list.
function M.json(rows)
  local list = {}
  for i, r in ipairs(rows) do
    list[i] = { rank = i, dp = r.dp, tp = r.tp, pp = r.pp, cp = r.cp, zero_stage = r.zero_stage,
                offload_optimizer = r.offload == true,
                sequence_parallel = r.sequence_parallel, recompute = r.recompute,
                micro_batch = r.micro_batch,
                grad_accum = r.grad_accum, schedule = r.schedule, virtual = r.virtual,
                mem_gib = r.mem_gib, mem_rank0_bytes = r.mem_rank0,
                mem_bytes = r.mem.total, params_bytes = r.mem.params, grads_bytes = r.mem.grads,
                optimizer_bytes = r.mem.optimizer, activation_bytes = r.mem.activations,
                comm_bytes = r.mem.comm, step_s = r.step_s, compute_s = r.compute_s,
                exposed_comm_s = r.exposed_comm_s, bubble_s = r.bubble_s,
                tokens_per_s = r.tokens_per_s, mfu = r.mfu, fits = r.fits,
                settings = plan.settings(r) }
  end
  return require("tetra.util.json").encode(list)
end

-- The published rows (tetra.planner.published) beside the planner's predictions, as a
-- Markdown table.
function M.published()
  local P = require("tetra.planner.published")
  local out = { "| run | GPUs | tp x pp x dp | batch | published | predicted | error | planner's layout |",
                "|---|---|---|---|---|---|---|---|" }
  for _, row in ipairs(P.rows) do
    local r, v = P.predict(row)
    local function show(x)
      return row.metric == "mfu" and string.format("%.1f%% MFU", 100 * x) or
             string.format("%.0f tok/s/GPU", x)
    end
    local sched = r.pp > 1 and string.format(", %s v%d", r.schedule, r.virtual) or ""
    if r.recompute ~= "none" then sched = sched .. ", " .. r.recompute .. " recompute" end
    out[#out + 1] = string.format("| %s%s | %d | %d x %d x %d | %d | %s | %s | %+.1f%% | mb %d, ZeRO-%s, SP %s%s |",
      row.name, row.calibration and " (calibration)" or "", row.tp * row.pp * row.dp, row.tp,
      row.pp, row.dp, row.batch, show(row.value), show(v), 100 * (v - row.value) / row.value,
      r.micro_batch, r.zero_stage >= 1 and r.zero_stage .. " on" or "1 off",
      r.sequence_parallel and "on" or "off",
      sched)
  end
  return table.concat(out, "\n") .. "\n"
end

-- The cluster o names with o's overrides. The cpu cluster takes this machine's measured
-- rates (tetra.planner.local_cpu: cached, or measured now; --measure measures again)
-- unless --preset-rates; the overrides still win. The layouts are priced in cfg's
-- train.precision, except its default fp32 on a GPU cluster, which keeps the cluster's
-- bf16 (the table's header names the precision). Returns the cluster and a line that
-- says where the cpu rates came from (nil for a preset).
function M.cluster_of(o, who, cfg)
  local over, line = o.over, nil
  if o.cluster == "cpu" and not o.preset_rates then
    local lc = require("tetra.planner.local_cpu")
    local r = lc.rates({ fresh = o.measure, say = function(text)
      io.stderr:write(who or "tetra plan", ": ", text, "\n")
    end })
    local measured
    measured, line = lc.over(r)
    for k, v in pairs(o.over) do measured[k] = v end
    over = measured
  end
  local cl = plan.cluster(o.cluster, over)
  local p = cfg and cfg.train.precision or "fp32"
  if p ~= "fp32" then cl.precision = p end
  return cl, line
end

function M.main(...)
  local o, err = M.parse({ ... })
  if not o then return usage_error(err) end
  if o.help then io.write(M.usage); return 0 end
  if o.published then io.write(M.published()); return 0 end
  local ok, res = pcall(function()
    local cfg = M.load_config(o.file, o.sets)
    plan.cluster(o.cluster, o.over)   -- an unknown name or override: refused before measuring
    local cl, rates = M.cluster_of(o, nil, cfg)
    return { cl = cl, cfg = cfg, rates = rates, rows = plan.search(cfg, cl, { fixed = o.fixed }) }
  end)
  if not ok then
    local msg = type(res) == "table" and res.message or tostring(res)
    io.stderr:write("tetra plan: ", msg, "\n")
    return 2
  end
  local rows, cl, cfg = res.rows, res.cl, res.cfg
  if #rows == 0 then
    io.stderr:write(string.format("tetra plan: no valid layout of %d devices for this model " ..
      "and batch %d (the layout rules reject every split; try another --batch or cluster)\n",
      cl.devices, cfg.train.batch_size))
    return 1
  end
  if o.write then
    local pick = o.pick or 1
    if pick > #rows then return usage_error(string.format("--pick %d: only %d layouts", pick, #rows)) end
    local f, ferr = io.open(o.write, "w")
    if not f then return usage_error("cannot write " .. o.write .. ": " .. tostring(ferr)) end
    f:write(plan.yaml(cfg, rows[pick], cl))
    f:close()
  end
  local shown = rows
  if not o.all and #rows > o.top then
    shown = {}
    for i = 1, o.top do shown[i] = rows[i] end
  end
  if o.json then
    if res.rates then io.stderr:write("# ", res.rates, "\n") end
    io.write(M.json(shown), "\n")
  else
    if res.rates then io.write("# ", res.rates, "\n") end
    io.write(M.table(shown, cl, cfg))
    if #shown < #rows then io.write(string.format("# %d more layouts (--all)\n", #rows - #shown)) end
    if o.write then io.write("# wrote layout ", o.pick or 1, " to ", o.write, "\n") end
  end
  return 0
end

return M
