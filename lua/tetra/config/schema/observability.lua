-- Config keys of the observability sinks beyond the metrics file: the Prometheus
-- endpoint (tetra.obs.telemetry), the step trace (tetra.obs.trace), the op profile of a
-- step (tetra.obs.ops) and MFU's device peak (tetra.obs.mfu). docs/monitoring.md
-- describes them.
local config = require("tetra.config.registry")

config.register_check(function(cfg)
  local log = cfg.log or {}
  local steps = (cfg.train or {}).steps
  if log.trace_steps ~= nil then
    local first, err = require("tetra.obs.trace").parse_steps(log.trace_steps)
    if not first then config.error("%s", err) end
    if steps and first > steps then
      config.error("log.trace_steps = %q: the run has %d steps (train.steps), so no step " ..
                   "would be traced; choose steps within 1-%d", tostring(log.trace_steps),
                   steps, steps)
    end
  end
  if log.op_profile_step and steps and log.op_profile_step > steps then
    config.error("log.op_profile_step = %d: the run has %d steps (train.steps), so no step " ..
                 "would be profiled; choose one of steps 1-%d", log.op_profile_step, steps,
                 steps)
  end
  if log.op_profile_step and (cfg.train or {}).cuda_graphs then
    config.error("log.op_profile_step with train.cuda_graphs: a replayed step records no " ..
                 "ops, so there is nothing to profile; set train.cuda_graphs=false for the " ..
                 "profiled run")
  end
  if log.prometheus_port == nil then return end
  local tffi = require("tetra.ffi")
  tffi.cdef_header("tetra_telemetry.h")
  if tffi.C.tt_prom_available() == 0 then
    config.error("log.prometheus_port: this tetra was built without libmicrohttpd, so it " ..
                 "cannot serve metrics (apt-get install libmicrohttpd-dev and rebuild, or " ..
                 "drop the key)")
  end
  if log.prometheus_port > 65535 then
    config.error("log.prometheus_port = %d: not a TCP port (1-65535)", log.prometheus_port)
  end
  if not tostring(log.prometheus_job):match("^[%w_.:-]+$") then
    config.error("log.prometheus_job = %q: use letters, digits and _ . : - only",
                 tostring(log.prometheus_job))
  end
end)

return {
  log = {
    prometheus_port = { type = "int", min = 0, doc = "serve Prometheus /metrics on this " ..
      "port + the local rank (unset: no endpoint; 0: any free port)" },
    prometheus_addr = { type = "str", default = "127.0.0.1",
      doc = "address the endpoint binds (0.0.0.0 for a Prometheus on another host)" },
    prometheus_job = { type = "str", default = "tetra", doc = "the job label of every series" },
    prometheus_required = { type = "bool", default = true,
      doc = "true: a port that cannot be bound stops the run; false: warn and train on" },
    straggler_factor = { type = "num", default = 1.5, min = 0, doc = "rank 0 warns when " ..
      "a rank's compute time (step less collective waits) exceeds this x the ranks' " ..
      "median for log.straggler_steps steps in a row (0: no warning; docs/monitoring.md)" },
    straggler_steps = { type = "int", default = 3, min = 1,
      doc = "consecutive slow steps before log.straggler_factor warns" },
    trace_steps = { type = "any", doc = "FIRST:LAST (or one step): write a Chrome/Perfetto " ..
      "trace of those steps, one file per rank (tetra.obs.trace)" },
    trace_dir = { type = "str", default = "trace", doc = "where log.trace_steps writes " ..
      "trace-rank<R>.json" },
    op_profile_step = { type = "int", min = 1, doc = "rank 0 prints where this step's " ..
      "time went, op by op (tetra.obs.ops): each op's forward and backward, recompute, " ..
      "and the step's regions (the optimizer's update ...), longest first; on CUDA from " ..
      "events, the kernels' time (not with train.cuda_graphs)" },
    op_profile_top = { type = "int", default = 25, min = 1,
      doc = "how many entries log.op_profile_step prints (the rest summed on one line)" },
  },
  train = {
    peak_tflops = { type = "num", min = 0, doc = "per-device dense peak TFLOP/s for MFU " ..
      "(default: the device's from tetra.obs.mfu's table; needed on the CPU)" },
  },
}
