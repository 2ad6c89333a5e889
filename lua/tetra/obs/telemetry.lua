-- tetra.obs.telemetry: the live figures of a run, served to Prometheus by every rank.
--
--   telemetry.start(cfg, mesh, gpu)   -- log.prometheus_port set: configure the store
--                                     -- (labels job, rank, dp, tp, pp, cp) and serve
--                                     -- http://log.prometheus_addr:(port + local rank)/metrics
--   telemetry.step(r)                 -- one metrics record (train.lua's env.step)
--   telemetry.checkpoint(seconds)     -- after a checkpoint save
--   telemetry.straggler(rank, s, ratio) -- rank 0: the slowest rank (tetra.obs.straggler)
--
-- The store and the HTTP server are C (engine/obs/telemetry.c, engine/obs/prometheus.c); the
-- server has its own thread, so a scrape never runs on the training thread. Without
-- log.prometheus_port nothing here does any work.
local ffi = require("ffi")
local tffi = require("tetra.ffi")
tffi.cdef_header("tetra_telemetry.h")
local C = ffi.C

local M = { serving = false }

local user_error = require("tetra.util.errors").raise

-- TETRA_RESTART_COUNT, set by the supervisor that restarts a failed job (absent: 0).
function M.restart_count()
  local v = os.getenv("TETRA_RESTART_COUNT")
  if v == nil or v == "" then return 0 end
  local n = tonumber(v)
  if not n or n < 0 or n ~= math.floor(n) then
    user_error("TETRA_RESTART_COUNT=" .. v .. ": expected a whole number of restarts " ..
               "(it is set by the supervisor; unset it to start counting at 0)")
  end
  return n
end

-- Starts this rank's endpoint when cfg.log.prometheus_port is set. gpu: the CUDA ordinal
-- whose NVML figures to report (nil on the CPU). A port that cannot be bound stops the
-- run (log.prometheus_required, the default) or prints one warning and trains on.
function M.start(cfg, mesh, gpu)
  local log = cfg.log or {}
  if log.prometheus_port == nil then return false end
  local c = mesh.coords
  C.tt_telemetry_configure(log.prometheus_job or "tetra", mesh.rank, c.dp, c.tp, c.pp, c.cp,
                           M.restart_count(), gpu or -1)
  local port = log.prometheus_port == 0 and 0 or log.prometheus_port + (mesh.local_rank or 0)
  if C.tt_prom_start(log.prometheus_addr or "127.0.0.1", port) ~= 0 then
    local msg = "rank " .. mesh.rank .. ": " .. ffi.string(C.tt_last_error())
    if log.prometheus_required ~= false then
      user_error(msg .. "; or set log.prometheus_required=false to train without it")
    end
    io.stderr:write("warning: ", msg, "; training goes on without metrics from this rank ",
                    "(log.prometheus_required=false)\n")
    return false
  end
  M.serving = true
  M.port = C.tt_prom_port()
  if log.prometheus_port == 0 or mesh.rank == 0 then
    print(string.format("prometheus: rank %d serves http://%s:%d/metrics%s", mesh.rank,
      log.prometheus_addr or "127.0.0.1", M.port,
      log.prometheus_port ~= 0 and (mesh.size or 1) > 1 and
        " (each rank on log.prometheus_port + its local rank)" or ""))
  end
  return true
end

local rec = ffi.new("tt_step_telemetry")

-- Publishes one metrics record (the fields train.lua's env.step fills).
function M.step(r)
  if not M.serving then return end
  rec.step, rec.loss, rec.lr = r.step, r.loss, r.lr
  rec.grad_norm = r.grad_norm or 0 / 0   -- a skipped step has none
  rec.tokens_per_s, rec.tokens_total, rec.step_time_s = r.tokens_per_s, r.tokens, r.step_time_s
  rec.data_wait_s, rec.forward_s, rec.backward_s = r.data_wait_s, r.forward_s, r.backward_s
  rec.exposed_comm_s, rec.optimizer_s, rec.other_s = r.exposed_comm_s, r.optimizer_s, r.other_s
  rec.loss_scale, rec.skipped, rec.mfu = r.loss_scale, r.skipped and 1 or 0, r.mfu or -1
  rec.live_bytes, rec.peak_bytes, rec.cached_bytes = r.live_bytes, r.peak_bytes, r.cached_bytes
  C.tt_telemetry_step(rec)
end

-- Rank 0: the slowest rank of the last step, its compute seconds and its ratio to the
-- median (tetra.obs.straggler; nil ratio: unknown).
function M.straggler(rank, compute_s, ratio)
  if M.serving then C.tt_telemetry_straggler(rank, compute_s, ratio or -1) end
end

function M.checkpoint(seconds)
  if M.serving then C.tt_telemetry_checkpoint(seconds) end
end

-- The exposition text this rank serves now (tests, the REPL).
function M.text()
  local p = C.tt_telemetry_format()
  if p == nil then error(ffi.string(C.tt_last_error()), 2) end
  local s = ffi.string(p)
  C.tt_telemetry_text_free(p)
  return s
end

return M
