-- tetra.metrics: wall clock, the JSONL metrics file and the terminal progress line.
--
-- The metrics file holds one JSON object per optimizer step. These field names are a
-- contract read by other tools and tests; add fields, never rename them:
--   step, loss, lr, grad_norm, tokens, tokens_per_s, step_time_s
--   (+ eval_loss on eval steps; data_wait_s, loader_tokens_per_s, loader_queue_depth
--    when the data loader reports them; loss_scale, skipped under AMP; the step's phases
--    data_wait_s, forward_s, backward_s, exposed_comm_s, optimizer_s, other_s, and
--    checkpoint_s, live_bytes, cached_bytes, mfu: see tetra.train's env.step; restarts,
--    data_position, guard and roll_back from the training loop's fault handling;
--    rank_compute_s, rank_wait_s, straggler_rank, straggler_compute_s, straggler_ratio
--    from tetra.obs.straggler with more than one rank)
local ffi = require("ffi")
local json = require("tetra.util.json")
local fs = require("tetra.util.fs")
local raise = require("tetra.util.errors").raise

local metrics = {}

-- Declared under private names so they cannot clash with another module's cdef of the
-- same libc functions.
ffi.cdef [[
typedef struct tt_metrics_timespec { long tv_sec; long tv_nsec; } tt_metrics_timespec;
int tt_metrics_clock_gettime(int clk, tt_metrics_timespec *ts) __asm__("clock_gettime");
int tt_metrics_isatty(int fd) __asm__("isatty");
]]

local ts = ffi.new("tt_metrics_timespec")
local CLOCK_MONOTONIC = 1

-- Seconds from an arbitrary origin, monotonic, sub-microsecond resolution.
-- The median of a list of numbers (the mean of the two middle ones for an even count; nil
-- for none); xs is left as it was.
function metrics.median(xs)
  local s = {}
  for i, x in ipairs(xs) do s[i] = x end
  table.sort(s)
  local n = #s
  if n == 0 then return nil end
  if n % 2 == 1 then return s[(n + 1) / 2] end
  return (s[n / 2] + s[n / 2 + 1]) / 2
end

function metrics.now()
  ffi.C.tt_metrics_clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

function metrics.stdout_is_terminal()
  return ffi.C.tt_metrics_isatty(1) == 1
end

-- -- JSON ------------------------------------------------------------------------------

-- The contract fields first, in this order, then any others sorted by name; numbers with
-- 9 significant digits, which a float32 loss or a timing does not need more than.
local JSON_OPTS = { float = "%.9g",
                    first = { "step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s",
                              "step_time_s" } }

-- One table -> one JSON object on one line (nested tables become arrays or objects).
function metrics.encode(record)
  return json.encode(record, JSON_OPTS)
end

-- -- Metrics file ----------------------------------------------------------------------

local Writer = {}
Writer.__index = Writer

-- Opens `path` for writing (mode "w" or "a"), creating its folder; `who` names the key.
function metrics.open_file(path, mode, who)
  local dir = path:match("^(.*)/[^/]*$")
  if dir and dir ~= "" then fs.mkdir_p(dir, who) end
  local f, err = io.open(path, mode)
  if not f then raise("%s: cannot open %s: %s", who, path, tostring(err)) end
  return f
end

-- Opens (truncates) `path` for JSON lines, creating its folder. Returns a writer; nil
-- path gives a writer that discards records, so callers need no branches.
function metrics.open(path)
  if not path or path == "" then
    return setmetatable({}, Writer)
  end
  local f = metrics.open_file(path, "w", "log.metrics_file")
  return setmetatable({ file = f, path = path, who = "log.metrics_file" }, Writer)
end

-- A log file opened with open_file, as a writer of lines (`who` names its key).
function metrics.lines(file, path, who)
  return setmetatable({ file = file, path = path, who = who }, Writer)
end

-- Writes the strings and flushes. A write that fails (a full disk, a quota) is said once
-- on stderr and the file is dropped: the run goes on without it, not silently.
function Writer:put(...)
  if not self.file then return end
  local ok, err = self.file:write(...)
  if ok then ok, err = self.file:flush() end
  if ok then return end
  io.stderr:write(string.format("tetra: warning: %s: writing %s failed: %s; the run goes " ..
                                "on without it\n", self.who, self.path, tostring(err)))
  io.stderr:flush()
  self.file:close()
  self.file = nil
end

function Writer:write(record)
  if self.file then self:put(metrics.encode(record), "\n") end
end

function Writer:close()
  if self.file then
    self.file:close()
    self.file = nil
  end
end

-- Reads a JSONL metrics file back as an array of tables (numbers, strings, booleans,
-- arrays of numbers, null as nil). Only handles the flat objects written above.
function metrics.read(path)
  local f, err = io.open(path, "r")
  if not f then error("metrics: cannot open " .. path .. ": " .. tostring(err), 2) end
  local rows = {}
  for line in f:lines() do
    if line:find("%S") then
      local row = {}
      -- Arrays of numbers first (rank_compute_s ...), each left as a null for the rest.
      line = line:gsub('"([^"]+)":%[([^%]]*)%]', function(k, body)
        local a = {}
        for v in body:gmatch("[^,]+") do a[#a + 1] = tonumber(v) end
        row[k] = a
        return '"' .. k .. '":null'
      end)
      for k, v in line:gmatch('"([^"]+)":([^,}]+)') do
        if v == "true" or v == "false" then row[k] = (v == "true")
        elseif v:sub(1, 1) == '"' then row[k] = v:sub(2, -2)
        elseif v ~= "null" then row[k] = tonumber(v) end
      end
      rows[#rows + 1] = row
    end
  end
  f:close()
  return rows
end

-- -- Progress line ---------------------------------------------------------------------

local function duration(s)
  if s ~= s or s == math.huge then return "?" end
  s = math.floor(s + 0.5)
  if s >= 3600 then return string.format("%dh%02dm", math.floor(s / 3600), math.floor(s % 3600 / 60)) end
  return s >= 60 and string.format("%dm%02ds", math.floor(s / 60), s % 60)
                 or string.format("%ds", s)
end

local function thousands(n)
  local s = string.format("%d", math.floor(n + 0.5))
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^,", ""))
end

-- "step   12/200 | loss 3.4512 | lr 3.00e-04 | gnorm 0.812 | 12,345 tok/s | ETA 1m23s"
function metrics.progress_line(r, total_steps, eta_s)
  local width = #tostring(total_steps)
  local parts = {
    string.format("step %" .. width .. "d/%d", r.step, total_steps),
    string.format("loss %.4f", r.loss),
    string.format("lr %.2e", r.lr),
    string.format("gnorm %.3f", r.grad_norm),
    thousands(r.tokens_per_s) .. " tok/s",
    "ETA " .. duration(eta_s),
  }
  if r.eval_loss then table.insert(parts, 3, string.format("eval %.4f", r.eval_loss)) end
  return table.concat(parts, " | ")
end

return metrics
