-- Observability: the step-time breakdown and MFU in the metrics records, the device peak
-- table, the observability config keys, and the Prometheus text the store formats
-- (parsed here line by line, and linted by promtool when it is installed).
local tetra = require("tetra")
local train = tetra.train
local config = require("tetra.config")
local mfu = require("tetra.obs.mfu")
local telemetry = require("tetra.obs.telemetry")
local straggler = require("tetra.obs.straggler")

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")

local function tiny_cfg(sets)
  local cfg = config.build({ defaults = tiny.defaults, sets = sets or {}, world_size = false })
  cfg.log.progress = false
  return cfg
end

local PHASES = { "data_wait_s", "forward_s", "backward_s", "exposed_comm_s", "optimizer_s",
                 "other_s" }

describe("step-time breakdown and MFU", function()
  it("adds the phases up to the step time, each plausible, with MFU from the override", function()
    local cfg = tiny_cfg({ "train.peak_tflops=0.5", "train.steps=4" })
    local env = tiny.setup(cfg)
    local flops = mfu.flops_per_token(tiny.Model(cfg.model), cfg.model)
    for _ = 1, 4 do
      local r = env.step()
      local sum = 0
      for _, k in ipairs(PHASES) do
        expect(type(r[k])).to_be("number")
        sum = sum + r[k]
      end
      expect(sum).to_be_near(r.step_time_s, 1e-9)
      -- Forward and backward are timed; other is what is left. (Their shares of the step
      -- are the machine's business: a busy core stretches any phase.)
      expect(r.forward_s > 0 and r.backward_s > 0).to_be(true)
      expect(r.other_s > -1e-9).to_be(true)
      expect(r.exposed_comm_s).to_be(0)   -- one process: nothing to wait for
      expect(r.mfu).to_be_near(flops * r.tokens_per_s / 0.5e12, 1e-12)
      expect(r.live_bytes > 0 and r.cached_bytes >= 0).to_be(true)
    end
  end)

  it("has no MFU on the CPU without train.peak_tflops", function()
    local env = tiny.setup(tiny_cfg({ "train.steps=2" }))
    expect(env.step().mfu).to_be_nil()
  end)

  it("counts 6 N + 12 L d T FLOPs per token, leaving lookups out and a tied head in", function()
    local m = tiny_cfg().model
    local untied = tiny.Model(m)
    local n = untied:num_params()
    expect(mfu.flops_per_token(untied, m)).to_be(6 * (n - m.vocab_size * m.dim) +
                                                 12 * m.n_layers * m.dim * m.seq_len)
    local tm = tiny_cfg({ "model.tie_embeddings=true" }).model
    local tied = tiny.Model(tm)
    expect(mfu.flops_per_token(tied, tm)).to_be(6 * tied:num_params() +
                                               12 * tm.n_layers * tm.dim * tm.seq_len)
  end)

  it("knows the dense peaks of the common GPUs by name and precision", function()
    local function peak(name, precision)
      return mfu.peak_tflops({ train = { precision = precision } }, name)
    end
    expect(peak("NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)", "bf16")).to_be(989.4)
    expect(peak("NVIDIA H100 80GB HBM3", "fp8")).to_be(1978.9)
    expect(peak("NVIDIA H100 PCIe", "bf16")).to_be(756.5)
    expect(peak("NVIDIA H200", "bf16")).to_be(989.4)
    expect(peak("NVIDIA H200 NVL", "fp16")).to_be(835.5)
    expect(peak("NVIDIA A100-SXM4-80GB", "bf16")).to_be(312)
    expect(peak("NVIDIA A100-SXM4-80GB", "fp32")).to_be(156)
    expect(peak("NVIDIA A100-SXM4-80GB", "fp8")).to_be_nil()   -- no FP8 on Ampere
    expect(peak("Some Future GPU", "bf16")).to_be_nil()
    expect(peak(nil, "fp32")).to_be_nil()                         -- the CPU
    expect(mfu.peak_tflops({ train = { peak_tflops = 2.5 } }, nil)).to_be(2.5)
    expect(mfu.peak_tflops({ train = { peak_tflops = 100, precision = "bf16" } },
                           "NVIDIA H100 80GB HBM3")).to_be(100)
  end)
end)

describe("observability config keys", function()
  local function refused(sets, pattern)
    local ok, err = pcall(tiny_cfg, sets)
    expect(ok).to_be(false)
    expect(config.is_error(err)).to_be(true)
    expect(err.message).to_match(pattern)
  end

  it("takes the Prometheus keys with their defaults", function()
    local cfg = tiny_cfg({ "log.prometheus_port=9400" })
    expect(cfg.log.prometheus_port).to_be(9400)
    expect(cfg.log.prometheus_addr).to_be("127.0.0.1")
    expect(cfg.log.prometheus_job).to_be("tetra")
    expect(cfg.log.prometheus_required).to_be(true)
    expect(tiny_cfg().log.prometheus_port).to_be_nil()
  end)

  it("refuses impossible values with the key named", function()
    refused({ "log.prometheus_port=70000" }, "log%.prometheus_port = 70000: not a TCP port")
    refused({ "log.prometheus_port=-1" }, "log%.prometheus_port")
    refused({ "log.prometheus_port=9400", "log.prometheus_job=my job" },
            "log%.prometheus_job")
    refused({ "log.prometheus_prot=9400" }, "prometheus_port")   -- did you mean
    refused({ "train.peak_tflops=-1" }, "train%.peak_tflops")
  end)

  it("reads TETRA_RESTART_COUNT (absent: 0)", function()
    expect(telemetry.restart_count()).to_be(tonumber(os.getenv("TETRA_RESTART_COUNT") or "0"))
  end)
end)

-- -- The exposition text ------------------------------------------------------------------

-- Parses Prometheus text format 0.0.4 strictly enough for our output: every sample's
-- family has # HELP and # TYPE before it; returns families[name] = { type, samples =
-- { { name, labels = {k = v}, value } } }.
local function parse_exposition(text)
  local families, order, current = {}, {}, nil
  for line in text:gmatch("[^\n]+") do
    local kind, name, rest = line:match("^# (%u+) ([%w_:]+) (.*)$")
    if kind == "HELP" then
      expect(families[name]).to_be_nil()     -- each family once
      families[name] = { help = rest, samples = {} }
      order[#order + 1] = name
      current = name
    elseif kind == "TYPE" then
      expect(current).to_be(name)
      families[name].type = rest
    else
      local sname, labels, value = line:match("^([%w_:]+){(.-)} (%S+)$")
      expect(sname ~= nil).to_be(true)
      local fam = families[current]
      local base = sname:gsub("_bucket$", ""):gsub("_sum$", ""):gsub("_count$", "")
      expect(sname == current or (fam.type == "histogram" and base == current)).to_be(true)
      local l = {}
      for k, v in labels:gmatch('([%w_]+)="(.-)"') do l[k] = v end
      local num = value == "NaN" and 0 / 0 or value == "+Inf" and math.huge or tonumber(value)
      expect(num ~= nil).to_be(true)
      fam.samples[#fam.samples + 1] = { name = sname, labels = l, value = num }
    end
  end
  return families, order
end

describe("the straggler summary", function()
  it("names the slowest rank and its ratio to the median", function()
    local s = straggler.summarize({ { 0.10, 0.30 }, { 0.40, 0.01 }, { 0.12, 0.28 } })
    expect(s.rank).to_be(1)
    expect(s.compute_s).to_be(0.40)
    expect(s.median_s).to_be(0.12)
    expect(s.ratio).to_be_near(0.40 / 0.12, 1e-12)
    expect(straggler.summarize({ { 0, 0 }, { 0, 0 } }).ratio).to_be_nil()
  end)

  it("warns once per rank when a streak over the factor reaches its length", function()
    local t = setmetatable({ factor = 1.5, steps = 3, streak = {} },
                           getmetatable(straggler.new({ log = {} }, { size = 2, rank = 1 })))
    local function step(c) return #t:judge(straggler.summarize(c)) end
    local slow, even = { { 0.1, 0 }, { 0.1, 0 }, { 0.2, 0 } }, { { 0.1, 0 }, { 0.1, 0 }, { 0.14, 0 } }
    expect(step(slow) + step(slow)).to_be(0)
    expect(step(even)).to_be(0)          -- 1.4x: the streak starts again
    expect(step(slow) + step(slow)).to_be(0)
    expect(t:judge(straggler.summarize(slow))[1]).to_be(2)
    expect(step(slow)).to_be(0)          -- reported once, not every step after
  end)

  it("does not call a rank slow for a lag of milliseconds, however large the ratio", function()
    local t = setmetatable({ factor = 1.5, steps = 1, streak = {} },
                           getmetatable(straggler.new({ log = {} }, { size = 2, rank = 1 })))
    local tiny = { { 0.002, 0 }, { 0.002, 0 }, { 0.002 + straggler.MIN_GAP_S / 2, 0 } }
    expect(#t:judge(straggler.summarize(tiny))).to_be(0)
    local real = { { 0.002, 0 }, { 0.002, 0 }, { 0.002 + straggler.MIN_GAP_S * 2, 0 } }
    expect(t:judge(straggler.summarize(real))[1]).to_be(2)
  end)
end)

describe("the Prometheus text", function()
  it("has HELP, TYPE, the job and mesh labels and cumulative histograms", function()
    local ffi = require("ffi")
    local C = ffi.C
    local cfg = tiny_cfg({ "train.steps=3", "train.peak_tflops=1" })
    local env = tiny.setup(cfg)
    -- The store without the HTTP server (that is tests/cli/prometheus_endpoint.sh's).
    C.tt_telemetry_configure("spec", 0, 0, 0, 0, 0, 3, -1)
    telemetry.serving = true
    local records = {}
    for i = 1, 3 do records[i] = env.step() end
    telemetry.straggler(2, 0.25, 1.8)   -- as rank 0 of a job would (tetra.obs.straggler)
    telemetry.serving = false
    C.tt_telemetry_collective("all_reduce", "dp", 0.0003)
    C.tt_telemetry_collective("all_reduce", "dp", 0.02)
    C.tt_telemetry_collective("send", "pp", 2e-6)
    local text = telemetry.text()
    local fam = parse_exposition(text)
    for name, f in pairs(fam) do
      expect(name:match("^tetra_") ~= nil).to_be(true)
      expect(f.type == "gauge" or f.type == "counter" or f.type == "histogram").to_be(true)
      expect(#f.help > 10).to_be(true)
      for _, s in ipairs(f.samples) do
        for _, k in ipairs({ "job", "rank", "dp", "tp", "pp", "cp" }) do
          expect(s.labels[k] ~= nil).to_be(true)
        end
        expect(s.labels.job).to_be("spec")
      end
      if f.type == "counter" then expect(name:match("_total$") ~= nil).to_be(true) end
    end
    local function value(name, want_labels)
      for _, f in pairs(fam) do
        for _, s in ipairs(f.samples) do
          local ok = s.name == name
          for k, v in pairs(want_labels or {}) do ok = ok and s.labels[k] == v end
          if ok then return s.value end
        end
      end
    end
    local last = records[3]
    expect(value("tetra_step")).to_be(3)
    expect(value("tetra_loss")).to_be(last.loss)
    expect(value("tetra_learning_rate")).to_be(last.lr)
    expect(value("tetra_tokens_total")).to_be(last.tokens)
    expect(value("tetra_mfu")).to_be(last.mfu)
    expect(value("tetra_restarts")).to_be(3)
    expect(value("tetra_step_phase_seconds", { phase = "backward" })).to_be(last.backward_s)
    -- This rank's step, wait and compute seconds (compared across ranks by TetraStraggler).
    expect(value("tetra_step_last_seconds")).to_be(last.step_time_s)
    expect(value("tetra_step_wait_seconds")).to_be(last.exposed_comm_s)
    expect(value("tetra_step_compute_seconds"))
      .to_be_near(last.step_time_s - last.exposed_comm_s, 1e-15)
    expect(value("tetra_straggler_rank")).to_be(2)
    expect(value("tetra_straggler_compute_seconds")).to_be(0.25)
    expect(value("tetra_straggler_ratio")).to_be(1.8)
    -- The step histogram: cumulative buckets, +Inf = count = steps, sum = the steps' times.
    local prev, sum = 0, 0
    for _, s in ipairs(fam.tetra_step_seconds.samples) do
      if s.name == "tetra_step_seconds_bucket" then
        expect(s.value >= prev).to_be(true)
        prev = s.value
      end
    end
    for _, r in ipairs(records) do sum = sum + r.step_time_s end
    expect(value("tetra_step_seconds_bucket", { le = "+Inf" })).to_be(3)
    expect(value("tetra_step_seconds_count")).to_be(3)
    expect(value("tetra_step_seconds_sum")).to_be_near(sum, 1e-12)
    -- Collectives: by op and group, each observation in its bucket.
    expect(value("tetra_collective_seconds_count", { op = "all_reduce", group = "dp" })).to_be(2)
    expect(value("tetra_collective_seconds_bucket",
                 { op = "all_reduce", group = "dp", le = "0.0005" })).to_be(1)
    expect(value("tetra_collective_seconds_bucket",
                 { op = "all_reduce", group = "dp", le = "0.025" })).to_be(2)
    expect(value("tetra_collective_seconds_bucket",
                 { op = "send", group = "pp", le = "1e-05" })).to_be(1)
    expect(value("tetra_collective_seconds_sum", { op = "all_reduce", group = "dp" }))
      .to_be_near(0.0203, 1e-12)
    -- No GPU here: no NVML series.
    expect(text:find("DCGM_", 1, true)).to_be_nil()

    -- promtool's linter reads it as valid exposition text.
    local has_promtool = os.execute("command -v promtool >/dev/null 2>&1") == 0
    if not has_promtool then
      expect(os.getenv("CI") == "true").to_be(false)   -- CI installs prometheus
      return
    end
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(text)
    f:close()
    local p = io.popen("promtool check metrics < " .. path .. " 2>&1")
    local lint = p:read("*a")
    p:close()
    os.remove(path)
    expect(lint).to_be("")
  end)
end)
