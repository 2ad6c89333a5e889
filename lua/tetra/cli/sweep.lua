-- tetra sweep: runs layouts for a few steps each under mpirun and puts what they measured
-- beside what `tetra plan` predicted: tokens/s, rank 0's allocator peak, exposed
-- communication.
--
--   tetra sweep [FILE] [--set k=v]... [--top K | --layout k=v,k=v ...] [--steps N] ...
--
-- --repeat N runs the list in N interleaved rounds (medians over them, M.combine);
-- --chart FILE.png draws the comparison as bars (M.chart, with tetra plot's gnuplot
-- helpers).
local plan = require("tetra.planner")
local cli_plan = require("tetra.cli.plan")
local json = require("tetra.util.json")

local M = {}

M.usage = [[
usage: tetra sweep [FILE] [--model NAME] [--set key=value]... [--batch N]
                   [--layout tp=2,pp=1,dp=1,cp=1,zero=0,sp=0,mb=1,schedule=1f1b,v=1,rc=none]...
                   [--top K] [--steps N] [--repeat N] [--threads N] [--timeout S]
                   [--json] [--keep DIR]
                   [--calibrate] [--chart FILE.png] [cluster options of tetra plan]
  Runs each layout (--layout, repeatable; or the plan's best K, default 5) with
  `mpirun -np RANKS tetra run FILE` for N steps (default 8; the first 2 are warm-up and
  the table shows medians of the rest) and prints measured against predicted tokens/s,
  rank 0's allocator peak (the metrics' peak_bytes) and exposed communication.
  --repeat N     run the whole list N times (default 1), layout after layout in each
                 round, and show each layout's medians over the rounds: a change in a
                 shared machine's load then falls on every layout alike
  --threads N    OMP_NUM_THREADS per rank (default 1: one core per rank, as the cpu
                 cluster assumes)
  --timeout S    seconds before a run is killed and counted as failed (default 300)
  --keep DIR     keep the metrics and logs in DIR
  --calibrate    the first layout of each rank count sets the cluster's sustained
                 fraction for the layouts of that many ranks, so that its predicted step
                 time is the measured one (a machine shared with other work runs slower
                 than its figures say, and gives a job of N ranks less than N cores);
                 every other row is then a prediction from those measurements
  --chart F.png  also draw the table as a PNG with gnuplot: measured and predicted bars
                 per layout for tokens/s, rank 0's peak MiB and exposed communication;
                 the data go to F.dat and the gnuplot script to F.gp
]]

local usage_error = require("tetra.util.errors").usage("tetra sweep", "see tetra sweep --help")

-- This executable's path (to run the same tetra under mpirun).
function M.self_exe()
  return require("tetra.util.fs").self_exe() or
         error("cannot find the tetra executable (/proc/self/exe)", 0)
end

local shell_quote = require("tetra.util.fs").shell_quote

-- A --layout value ("tp=2,pp=2,mb=1,...") as a layout table; nil, message if malformed.
local LAYOUT_KEYS = { tp = true, pp = true, dp = true, cp = true, zero = true, sp = true,
                      mb = true, schedule = true, v = true, rc = true }
function M.parse_layout(text, batch)
  local lay = { tp = 1, pp = 1, dp = 1, cp = 1, zero = 0, sp = false, v = 1, schedule = "1f1b",
                recompute = "none" }
  for item in text:gmatch("[^,]+") do
    local k, v = item:match("^%s*([%w_]+)%s*=%s*(.-)%s*$")
    if not k or not LAYOUT_KEYS[k] then
      return nil, "--layout: '" .. item .. "' is not one of tp, pp, dp, cp, zero, sp, mb, " ..
                  "schedule, v, rc as key=value"
    end
    if k == "schedule" then lay.schedule = v
    elseif k == "rc" then
      if v ~= "none" and v ~= "selective" and v ~= "full" then
        return nil, "--layout: rc (train.recompute) is none, selective or full, got '" .. v .. "'"
      end
      lay.recompute = v
    elseif k == "sp" then lay.sp = v == "1" or v == "true" or v == "y"
    else
      local x = tonumber(v)
      if not x or x < 0 or x ~= math.floor(x) then
        return nil, "--layout: " .. k .. " needs a whole number, got '" .. v .. "'"
      end
      lay[k == "mb" and "micro_batch" or k == "zero" and "zero" or k] = x
    end
  end
  lay.micro_batch = lay.micro_batch or batch / lay.dp
  return lay
end

local median = require("tetra.obs.metrics").median

-- Medians over steps > 2 of a metrics file: step_time_s, tokens_per_s, exposed_comm_s,
-- peak_bytes; nil when fewer than one such step.
function M.summarize(path)
  local f = io.open(path)
  if not f then return nil end
  local st, tps, comm, peak = {}, {}, {}, {}
  for line in f:lines() do
    if line:sub(1, 1) == "{" then
      local r = json.decode(line)
      if r.step and r.step > 2 then
        st[#st + 1], tps[#tps + 1] = r.step_time_s, r.tokens_per_s
        comm[#comm + 1], peak[#peak + 1] = r.exposed_comm_s, r.peak_bytes
      end
    end
  end
  f:close()
  if #st == 0 then return nil end
  return { step_s = median(st), tokens_per_s = median(tps), exposed_comm_s = median(comm),
           peak_bytes = median(peak), steps = #st }
end

-- Runs one layout; returns the measured summary or nil, a message.
local function run_one(o, exe, file, r, dir, name)
  local metrics, log = dir .. "/" .. name .. ".jsonl", dir .. "/" .. name .. ".log"
  os.remove(metrics)
  local args = { shell_quote(exe), "run", shell_quote(file) }
  for _, s in ipairs(o.sets) do args[#args + 1] = "--set " .. shell_quote(s) end
  for _, s in ipairs(plan.settings(r)) do args[#args + 1] = "--set " .. shell_quote(s) end
  args[#args + 1] = "--set train.steps=" .. o.steps
  args[#args + 1] = "--set train.warmup_steps=1"   -- the schedule's shape costs nothing
  args[#args + 1] = "--set log.progress=false"
  args[#args + 1] = "--set log.metrics_file=" .. shell_quote(metrics)
  local cmd = string.format(
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout %d mpirun " ..
    "--oversubscribe --bind-to none -np %d -x OMP_NUM_THREADS=%d %s > %s 2>&1",
    o.timeout, r.world, o.threads, table.concat(args, " "), shell_quote(log))
  local ok = os.execute(cmd)
  local s = M.summarize(metrics)
  if (ok ~= 0 and ok ~= true) or not s then
    -- The run's own message (tetra prints "tetra: ..."), else the log's last line.
    local why, last = nil, ""
    local lf = io.open(log)
    if lf then
      for line in lf:lines() do
        if not why and line:match("^tetra: ") then why = line end
        if line:match("%S") then last = line end
      end
      lf:close()
    end
    return nil, "failed: " .. (why or last) .. " (log: " .. log .. ")"
  end
  return s
end

-- -- The chart --------------------------------------------------------------------------

M.CHART_WIDTH, M.CHART_HEIGHT = 960, 1080

-- A short label for a result row: the sizes that are not 1, ZeRO-1, sequence
-- parallelism, the micro-batch and the pipeline schedule.
function M.short_label(r)
  local parts = {}
  for _, k in ipairs({ "dp", "tp", "pp", "cp" }) do
    if r[k] > 1 then parts[#parts + 1] = k .. r[k] end
  end
  if #parts == 0 then parts[1] = "1 rank" end
  if r.zero_stage >= 1 then parts[#parts + 1] = "ZeRO-" .. r.zero_stage end
  if r.sequence_parallel then parts[#parts + 1] = "SP" end
  if r.recompute and r.recompute ~= "none" then parts[#parts + 1] = r.recompute .. " recompute" end
  parts[#parts + 1] = "mb" .. r.micro_batch
  if r.pp > 1 then
    parts[#parts + 1] = r.schedule == "interleaved_1f1b" and ("interleaved v" .. r.virtual)
                        or r.schedule
  end
  return table.concat(parts, " ")
end

-- The columns of the chart's data file, after the row number and the label.
M.CHART_COLUMNS = { "measured_tokens_per_s", "predicted_tokens_per_s", "measured_peak_mib",
                    "predicted_peak_mib", "measured_exposed_comm_ms",
                    "predicted_exposed_comm_ms" }

local function cell(v)
  if type(v) ~= "number" or v ~= v then return "NaN" end
  return string.format("%.17g", v)
end

-- Draws `results` (the rows of the table: plan record and measured summary) as PNG `png`
-- with gnuplot: three panels of bars, measured beside predicted per layout, for
-- tokens/s, rank 0's allocator peak and exposed communication (with the bubble). The
-- data go to PNG_BASE.dat and the script to PNG_BASE.gp, so the chart can be redrawn
-- by hand. A failed run's measured bars are absent. Returns true or nil, one line.
function M.chart(results, png, title)
  local plot = require("tetra.cli.plot")
  local base = png:gsub("%.png$", "")
  local dat, gp = base .. ".dat", base .. ".gp"
  local f, err = io.open(dat, "w")
  if not f then return nil, "cannot write " .. dat .. ": " .. tostring(err) end
  f:write("# row label ", table.concat(M.CHART_COLUMNS, " "), "\n")
  for k, e in ipairs(results) do
    local r, s = e.plan, e.measured or {}
    local label = M.short_label(r) .. (e.calibration and " (calibration)" or "")
    f:write(table.concat({ k, '"' .. label .. '"',
      cell(s.tokens_per_s), cell(r.tokens_per_s),
      cell(s.peak_bytes and s.peak_bytes / 2 ^ 20), cell(r.mem_rank0 / 2 ^ 20),
      cell(s.exposed_comm_s and 1000 * s.exposed_comm_s),
      cell(1000 * (r.exposed_comm_s + r.bubble_s)) }, " "), "\n")
  end
  f:close()
  local q = plot.quote
  local lines = plot.preamble(M.CHART_WIDTH, M.CHART_HEIGHT)
  for _, l in ipairs({
    "set output " .. q(png),
    "set style data histograms",
    "set style histogram clustered gap 1",
    "set style fill solid 0.85 border -1",
    "set boxwidth 0.9",
    "set key top right",
    "set xtics rotate by -25 noenhanced",
    "set yrange [0:*]",
    string.format("set xrange [-0.6:%g]", #results - 0.4),
    "set bmargin 6",
    "set multiplot layout 3,1 title " .. q(title),
  }) do lines[#lines + 1] = l end
  local panels = {
    { "tokens/s", 3 }, { "rank 0 peak MiB", 5 }, { "exposed comm + bubble, ms", 7 },
  }
  for _, p in ipairs(panels) do
    lines[#lines + 1] = "set ylabel " .. q(p[1])
    lines[#lines + 1] = string.format(
      "plot %s using %d:xtic(2) title 'measured' linecolor rgb '#1f77b4', " ..
      "'' using %d title 'predicted' linecolor rgb '#ff7f0e'", q(dat), p[2], p[2] + 1)
  end
  lines[#lines + 1] = "unset multiplot"
  f, err = io.open(gp, "w")
  if not f then return nil, "cannot write " .. gp .. ": " .. tostring(err) end
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  return plot.run_gnuplot(gp)
end

-- One layout's figures over its rounds (M.summarize of each run): the median of each,
-- and every round's step time (step_s_runs).
function M.combine(runs)
  local out = { step_s_runs = {}, steps = 0 }
  for _, k in ipairs({ "step_s", "tokens_per_s", "exposed_comm_s", "peak_bytes" }) do
    local xs = {}
    for i, s in ipairs(runs) do xs[i] = s[k] end
    out[k] = median(xs)
  end
  for i, s in ipairs(runs) do
    out.step_s_runs[i] = s.step_s
    out.steps = out.steps + s.steps
  end
  return out
end

local function pct(pred, meas)
  return meas and meas ~= 0 and string.format("%+.0f%%", 100 * (pred - meas) / meas) or "-"
end

function M.main(...)
  local args, layouts, rest = { ... }, {}, {}
  local o = { steps = 8, threads = 1, timeout = 300, top = 5, ["repeat"] = 1 }
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--help" or a == "-h" then io.write(M.usage); return 0
    elseif a == "--layout" or a == "--steps" or a == "--threads" or a == "--timeout" or
           a == "--keep" or a == "--chart" or a == "--repeat" then
      local v = args[i + 1]
      if not v then return usage_error(a .. " needs a value") end
      if a == "--layout" then layouts[#layouts + 1] = v
      elseif a == "--keep" then o.keep = v
      elseif a == "--chart" then o.chart = v
      else
        local x = tonumber(v)
        if not x or x < 1 or x ~= math.floor(x) then
          return usage_error(a .. " needs a whole number, got '" .. v .. "'")
        end
        o[a:sub(3)] = x
      end
      i = i + 2
    elseif a == "--json" then o.json = true; i = i + 1
    elseif a == "--calibrate" then o.calibrate = true; i = i + 1
    else rest[#rest + 1] = a; i = i + 1 end
  end
  if o.steps < 3 then return usage_error("--steps must be at least 3 (2 warm-up steps are skipped)") end
  if o.chart then
    -- Refused before any run: a chart that cannot be drawn would waste the sweep.
    if not o.chart:match("%.png$") then
      return usage_error("--chart needs a file name ending in .png, got '" .. o.chart .. "'")
    end
    local have, why = require("tetra.cli.plot").gnuplot_available()
    if not have then return usage_error("--chart: " .. why) end
    local probe = o.chart:gsub("%.png$", ".dat")
    local f, ferr = io.open(probe, "w")
    if not f then return usage_error("--chart: cannot write " .. tostring(ferr)) end
    f:close()
  end
  local po, err = cli_plan.parse(rest)
  if not po then return usage_error(err) end
  o.sets = po.sets
  local ok, res = pcall(function()
    local cfg = cli_plan.load_config(po.file, po.sets)
    plan.cluster(po.cluster, po.over)   -- an unknown name or override: refused before measuring
    return { cfg = cfg }
  end)
  if not ok then
    io.stderr:write("tetra sweep: ", type(res) == "table" and res.message or tostring(res), "\n")
    return 2
  end
  local cfg = res.cfg
  -- The layouts are checked before the cpu cluster's rates are measured.
  local lays = {}
  for _, text in ipairs(layouts) do
    local lay, lerr = M.parse_layout(text, cfg.train.batch_size)
    if not lay then return usage_error(lerr) end
    local c = plan.with_layout(cfg, lay)
    local W = lay.tp * lay.pp * lay.dp * lay.cp
    local problems = require("tetra.parallel.layout").problems(c, W)
    if #problems > 0 then return usage_error("--layout " .. text .. ": " .. problems[1]) end
    lays[#lays + 1] = lay
  end
  if #layouts == 0 and o.calibrate then
    return usage_error("--calibrate needs --layout (the first layout of each rank count calibrates)")
  end
  local cl, rates = cli_plan.cluster_of(po, "tetra sweep", cfg)
  if rates then io.stderr:write("# ", rates, "\n") end
  local rows = {}
  if #lays > 0 then
    for _, lay in ipairs(lays) do
      rows[#rows + 1] = plan.evaluate(cfg, lay, cl)
      rows[#rows].layout = lay
    end
  else
    local all = plan.search(cfg, cl, { fixed = po.fixed })
    for k = 1, math.min(po.top or o.top, #all) do rows[k] = all[k] end
  end
  local file = po.file or (require("tetra.host").root .. "/recipes/llama.lua")
  local dir = o.keep or os.tmpname() .. ".d"
  os.execute("mkdir -p " .. shell_quote(dir))
  local exe = M.self_exe()
  local results, failed, calibrated = {}, 0, {}
  for k, r in ipairs(rows) do
    local name = string.format("%02d_dp%d_tp%d_pp%d_cp%d_z%d%s%s_mb%d_%s", k, r.dp, r.tp, r.pp,
      r.cp, r.zero_stage, r.sequence_parallel and "_sp" or "",
      (r.recompute or "none") ~= "none" and ("_rc" .. r.recompute) or "", r.micro_batch, r.schedule)
    results[k] = { name = name, plan = r, runs = {} }
  end
  -- Rounds: every layout once per round, so that a change in the machine's load falls on
  -- all of them alike; each layout's figures are the medians of its rounds.
  for round = 1, o["repeat"] do
    for _, e in ipairs(results) do
      if not e.why then
        local name = e.name .. (o["repeat"] > 1 and "_r" .. round or "")
        io.stderr:write(string.format("# running %s on %d ranks ... ", name, e.plan.world))
        local t0 = os.time()
        local s, why = run_one(o, exe, file, e.plan, dir, name)
        io.stderr:write(s and (os.time() - t0) .. " s\n" or why .. "\n")
        if s then e.runs[#e.runs + 1] = s else e.why = why; failed = failed + 1 end
      end
    end
  end
  for _, e in ipairs(results) do
    if not e.why then e.measured = M.combine(e.runs) end
  end
  if o.calibrate then
    for k, e in ipairs(results) do
      local r = e.plan
      if not calibrated[r.world] then
        local s = e.measured
        if not s then
          io.stderr:write("tetra sweep: the calibration run failed; nothing to compare\n")
          return 1
        end
        -- The sustained fraction that makes this layout's predicted step the measured
        -- one (every compute term scales with 1 / sustained; a few rounds settle the rest).
        local c = {}
        for key, val in pairs(cl) do c[key] = val end
        for _ = 1, 8 do
          c.sustained = c.sustained * plan.evaluate(cfg, r.layout, c).step_s / s.step_s
        end
        calibrated[r.world] = c
        e.calibration = true
        io.stderr:write(string.format("# calibrated %d-rank layouts: sustained fraction %.3f\n",
                                      r.world, c.sustained))
        for j = k, #results do
          local rj = results[j].plan
          if rj.world == r.world then
            results[j].plan = plan.evaluate(cfg, rj.layout, c)
            results[j].plan.layout = rj.layout
          end
        end
      end
    end
  end
  if not o.keep then os.execute("rm -rf " .. shell_quote(dir)) end
  if o.chart then
    local drawn, cerr = M.chart(results, o.chart, string.format(
      "tetra sweep: measured vs predicted (%s, %d steps per run, %d round%s)", cl.name,
      o.steps, o["repeat"], o["repeat"] > 1 and "s" or ""))
    if not drawn then
      io.stderr:write("tetra sweep: --chart: ", cerr, "\n")
      return 1
    end
    io.stderr:write("# chart: ", o.chart, "\n")
  end
  if o.json then
    local list = {}
    for k, e in ipairs(results) do
      local r, s = e.plan, e.measured
      list[k] = { name = e.name, dp = r.dp, tp = r.tp, pp = r.pp, cp = r.cp,
                  zero_stage = r.zero_stage, sequence_parallel = r.sequence_parallel,
                  recompute = r.recompute,
                  micro_batch = r.micro_batch, schedule = r.schedule, world = r.world,
                  predicted_tokens_per_s = r.tokens_per_s, predicted_step_s = r.step_s,
                  predicted_peak_bytes = r.mem_rank0,
                  predicted_exposed_comm_s = r.exposed_comm_s + r.bubble_s,
                  measured_tokens_per_s = s and s.tokens_per_s, measured_step_s = s and s.step_s,
                  measured_peak_bytes = s and s.peak_bytes,
                  measured_exposed_comm_s = s and s.exposed_comm_s,
                  measured_step_s_runs = s and s.step_s_runs, failed = s == nil,
                  calibration = e.calibration or false }
    end
    io.write(json.encode(list), "\n")
  else
    local fmt = "%-36s %5s %10s %10s %6s %9s %9s %6s %9s %9s\n"
    io.write(string.format("# %s; %d steps per run, medians of steps 3..%d%s; memory is rank " ..
      "0's allocator peak; exposed comm includes the pipeline bubble\n", cl.name, o.steps, o.steps,
      o["repeat"] > 1 and string.format(" and of %d interleaved rounds", o["repeat"]) or ""))
    for world, c in pairs(calibrated) do
      io.write(string.format("# %d-rank rows calibrated on the first of them: sustained " ..
                             "fraction %.3f\n", world, c.sustained))
    end
    io.write(string.format(fmt, "layout", "ranks", "tok/s meas", "tok/s pred", "err",
      "peak MiB", "pred MiB", "err", "comm ms", "pred ms"))
    for _, e in ipairs(results) do
      local r, s = e.plan, e.measured
      local pc = 1000 * (r.exposed_comm_s + r.bubble_s)
      if s then
        io.write(string.format(fmt, e.name, r.world, string.format("%.0f", s.tokens_per_s),
          string.format("%.0f", r.tokens_per_s), pct(r.tokens_per_s, s.tokens_per_s),
          string.format("%.1f", s.peak_bytes / 2 ^ 20), string.format("%.1f", r.mem_rank0 / 2 ^ 20),
          pct(r.mem_rank0, s.peak_bytes), string.format("%.1f", 1000 * s.exposed_comm_s),
          string.format("%.1f", pc)))
      else
        io.write(string.format(fmt, e.name, r.world, "FAILED", string.format("%.0f", r.tokens_per_s),
          "-", "-", string.format("%.1f", r.mem_rank0 / 2 ^ 20), "-", "-", string.format("%.1f", pc)))
      end
    end
  end
  return failed == 0 and 0 or 1
end

return M
