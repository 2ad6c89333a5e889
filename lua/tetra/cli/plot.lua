-- tetra plot OUT_DIR metrics.jsonl [more.jsonl ...] [--label NAME=FILE]...
--
-- Draws training metrics files (log.metrics_file) as PNG charts with gnuplot, for a
-- head node without a browser: loss.png (train lines, eval points), lr.png,
-- throughput.png (tokens/s), grad_norm.png, one chart per file overlaid and labelled,
-- and step_breakdown_<label>.png per file (the step's phases stacked). Tetra writes what
-- gnuplot reads into OUT_DIR/data/<label>.dat (and <label>.eval.dat) and the script into
-- OUT_DIR/plot.gp, so a chart can be redrawn or restyled by hand (`gnuplot plot.gp`).
-- Bad usage, a missing file or one that is not metrics JSONL, and no gnuplot: one line,
-- exit 2.
local json = require("tetra.util.json")
local fs = require("tetra.util.fs")

local M = {}

local USAGE = "usage: tetra plot OUT_DIR metrics.jsonl [more.jsonl ...] [--label NAME=FILE]"

-- The columns of a run's data file, in order (the first is the step).
M.COLUMNS = { "step", "loss", "lr", "grad_norm", "tokens_per_s", "data_wait_s",
              "forward_s", "backward_s", "exposed_comm_s", "optimizer_s", "checkpoint_s",
              "other_s" }
-- The step breakdown's phases, stacked bottom to top.
M.PHASES = { "data_wait_s", "forward_s", "backward_s", "exposed_comm_s", "optimizer_s",
             "checkpoint_s", "other_s" }
M.WIDTH, M.HEIGHT = 960, 540

local function column_of(name)
  for i, c in ipairs(M.COLUMNS) do
    if c == name then return i end
  end
end

local usage_error = require("tetra.util.errors").usage("tetra plot")

-- The records of one metrics file: an array of tables, or nil and a one-line message.
-- Every non-blank line must be a JSON object with a numeric step and loss.
function M.read_runs_file(path)
  local f, err = io.open(path, "r")
  if not f then return nil, "cannot read " .. path .. ": " .. tostring(err) end
  local rows, n = {}, 0
  for line in f:lines() do
    n = n + 1
    if line:find("%S") then
      local ok, r = pcall(json.decode, line)
      if not ok or type(r) ~= "table" or type(r.step) ~= "number" or
         type(r.loss) ~= "number" then
        f:close()
        return nil, string.format("%s:%d: not a metrics record (log.metrics_file writes " ..
                                  "one JSON object with step and loss per line)", path, n)
      end
      rows[#rows + 1] = r
    end
  end
  f:close()
  if #rows == 0 then return nil, path .. ": no metrics records (an empty file?)" end
  return rows
end

-- A number as gnuplot reads it; absent or non-numeric values are NaN (a gap).
local function num(v)
  if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge then return "NaN" end
  return string.format("%.17g", v)
end

-- Writes run.rows into run.data (every column) and run.eval_data (step, eval_loss of the
-- records that have one). Records which field each run has at least once.
local function write_data(run)
  local f = assert(io.open(run.data, "w"))
  f:write("# ", table.concat(M.COLUMNS, " "), "\n")
  run.has = {}
  local evals = {}
  for _, r in ipairs(run.rows) do
    local cells = {}
    for i, c in ipairs(M.COLUMNS) do
      cells[i] = num(r[c])
      if cells[i] ~= "NaN" then run.has[c] = true end
    end
    f:write(table.concat(cells, " "), "\n")
    if type(r.eval_loss) == "number" and r.eval_loss == r.eval_loss then
      evals[#evals + 1] = num(r.step) .. " " .. num(r.eval_loss)
    end
  end
  f:close()
  run.has.eval_loss = #evals > 0
  f = assert(io.open(run.eval_data, "w"))
  f:write("# step eval_loss\n", table.concat(evals, "\n"), #evals > 0 and "\n" or "")
  f:close()
end

-- A string as a gnuplot single-quoted literal.
local function q(s) return "'" .. s:gsub("'", "''") .. "'" end
M.quote = q

-- The gnuplot commands for one overlaid chart of `field` (a column name), or nil when
-- no run has it.
local function overlay_chart(out_dir, runs, name, title, ylabel, field, extra)
  local plots = {}
  local col = column_of(field)
  for i, run in ipairs(runs) do
    if run.has[field] then
      plots[#plots + 1] = string.format("%s using 1:%d with lines linestyle %d title %s",
        q(run.data), col, i, q(run.label .. (extra and " train" or "")))
    end
    if extra and run.has.eval_loss then
      plots[#plots + 1] = string.format(
        "%s using 1:2 with linespoints linestyle %d dashtype 2 pointtype 7 title %s",
        q(run.eval_data), i, q(run.label .. " eval"))
    end
  end
  if #plots == 0 then return nil end
  return table.concat({
    "set output " .. q(out_dir .. "/" .. name .. ".png"),
    "set title " .. q(title),
    "set ylabel " .. q(ylabel),
    "plot " .. table.concat(plots, ", \\\n     "),
    "", }, "\n"), name .. ".png"
end

-- The stacked step breakdown of one run: each phase a band from the sum of the phases
-- below it to that sum plus its own seconds (absent phases count 0).
local function breakdown_chart(out_dir, run)
  local any = false
  for _, p in ipairs(M.PHASES) do any = any or run.has[p] end
  if not any then return nil end
  local plots, below = {}, "0"
  for _, p in ipairs(M.PHASES) do
    local v = string.format("(valid(%d) ? $%d : 0)", column_of(p), column_of(p))
    local top = below .. " + " .. v
    plots[#plots + 1] = string.format("%s using 1:(%s):(%s) with filledcurves title %s",
      q(run.data), below, top, q(p:gsub("_s$", "")))
    below = top
  end
  local png = "step_breakdown_" .. run.file_label .. ".png"
  return table.concat({
    "set output " .. q(out_dir .. "/" .. png),
    "set title " .. q("step time by phase: " .. run.label),
    "set ylabel 'seconds'",
    "set style fill solid 0.85 noborder",
    "plot " .. table.concat(plots, ", \\\n     "),
    "set style fill empty",
    "", }, "\n"), png
end

-- Parses the arguments: out_dir, and the runs { path, label } in order. --label NAME=FILE
-- names FILE (and adds it when it is not also listed).
local function parse_args(args)
  local out_dir, runs, by_path, names = nil, {}, {}, {}
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--label" then
      local spec = args[i + 1]
      local name, path = (spec or ""):match("^([^=]+)=(.+)$")
      if not name then return nil, "--label needs NAME=FILE, got '" .. tostring(spec) .. "'" end
      names[path] = name
      if not by_path[path] then
        runs[#runs + 1] = { path = path }
        by_path[path] = runs[#runs]
      end
      i = i + 2
    elseif a:sub(1, 2) == "--" then
      return nil, "unknown option '" .. a .. "'"
    elseif not out_dir then
      out_dir = a
      i = i + 1
    else
      if not by_path[a] then
        runs[#runs + 1] = { path = a }
        by_path[a] = runs[#runs]
      end
      i = i + 1
    end
  end
  if not out_dir or #runs == 0 then return nil, "needs OUT_DIR and at least one metrics file" end
  -- Default labels: the file names without .jsonl, or the paths when two names agree
  -- (runs/a/metrics.jsonl and runs/b/metrics.jsonl).
  local count = {}
  for _, run in ipairs(runs) do
    run.base = run.path:match("([^/]+)$"):gsub("%.jsonl$", "")
    count[run.base] = (count[run.base] or 0) + 1
  end
  local used = {}
  for _, run in ipairs(runs) do
    run.label = names[run.path] or
                (count[run.base] > 1 and run.path:gsub("%.jsonl$", "") or run.base)
    -- A label in a file name: letters, digits, '.', '-', '_' (others become '_').
    local base = run.label:gsub("[^%w%.%-_]", "_")
    local fl, k = base, 2
    while used[fl] do fl, k = base .. "_" .. k, k + 1 end
    used[fl], run.file_label = true, fl
  end
  return out_dir, runs
end

local shell_quote = fs.shell_quote

-- Whether gnuplot is on PATH; else nil and the one line to print (shared with tetra
-- sweep's chart).
function M.gnuplot_available()
  if os.execute("command -v gnuplot >/dev/null 2>&1") == 0 then return true end
  return nil, "gnuplot is not installed (apt-get install gnuplot-nox; tools/setup installs it)"
end

-- The first lines of a PNG chart script: the terminal (width x height pixels), missing
-- values as gaps, a grid.
function M.preamble(width, height)
  return {
    string.format("set terminal pngcairo size %d,%d noenhanced font 'sans,11'", width, height),
    "set datafile missing 'NaN'",
    "set grid",
  }
end

-- Runs gnuplot on `script`; true, or nil and one line (gnuplot's first message).
function M.run_gnuplot(script)
  local log = script .. ".log"
  if os.execute(string.format("gnuplot %s >%s 2>&1", shell_quote(script),
                              shell_quote(log))) ~= 0 then
    local lf = io.open(log, "r")
    local first = lf and lf:read("*l") or ""
    if lf then lf:close() end
    return nil, "gnuplot failed on " .. script .. ": " .. first
  end
  os.remove(log)
  return true
end

function M.main(...)
  local args = { ... }
  if args[1] == "--help" or args[1] == "-h" then
    print(USAGE)
    return 0
  end
  local out_dir, runs = parse_args(args)
  if not out_dir then return usage_error(runs .. " (" .. USAGE .. ")") end
  for _, run in ipairs(runs) do
    local rows, err = M.read_runs_file(run.path)
    if not rows then return usage_error(err) end
    run.rows = rows
  end
  local have, why = M.gnuplot_available()
  if not have then return usage_error(why) end
  local ok, err = pcall(fs.mkdir_p, out_dir .. "/data", "tetra plot")
  if not ok then return usage_error(tostring(err)) end
  for _, run in ipairs(runs) do
    run.data = out_dir .. "/data/" .. run.file_label .. ".dat"
    run.eval_data = out_dir .. "/data/" .. run.file_label .. ".eval.dat"
    write_data(run)
  end

  local parts = M.preamble(M.WIDTH, M.HEIGHT)
  parts[#parts + 1] = "set key outside right top"
  parts[#parts + 1] = "set xlabel 'step'"
  parts[#parts + 1] = ""
  for i = 1, #runs do
    parts[#parts + 1] = string.format("set linetype %d linewidth 2", i)
    parts[#parts + 1] = string.format("set style line %d linetype %d linewidth 2", i, i)
  end
  local written = {}
  local function add(text, png)
    if text then
      parts[#parts + 1] = text
      written[#written + 1] = png
    end
  end
  add(overlay_chart(out_dir, runs, "loss", "loss", "loss", "loss", true))
  add(overlay_chart(out_dir, runs, "lr", "learning rate", "lr", "lr"))
  add(overlay_chart(out_dir, runs, "throughput", "throughput", "tokens/s", "tokens_per_s"))
  add(overlay_chart(out_dir, runs, "grad_norm", "gradient norm (before clipping)",
                    "grad norm", "grad_norm"))
  for _, run in ipairs(runs) do add(breakdown_chart(out_dir, run)) end

  local script = out_dir .. "/plot.gp"
  local f = assert(io.open(script, "w"))
  f:write(table.concat(parts, "\n"), "\n")
  f:close()
  local drawn, gp_err = M.run_gnuplot(script)
  if not drawn then return usage_error(gp_err) end
  print(string.format("%s: %s (%d runs; data in %s/data, script %s)", out_dir,
                      table.concat(written, ", "), #runs, out_dir, script))
  return 0
end

return M
