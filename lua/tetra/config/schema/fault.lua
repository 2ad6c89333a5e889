-- Config keys of fault tolerance: the loss guard (tetra.train), asynchronous checkpoints
-- (tetra.checkpoint) and the test switches that inject faults. tetra.config loads this
-- file with the rest of lua/tetra/schema/.
local config = require("tetra.config.registry")

-- Keys that would do nothing are refused.
config.register_check(function(cfg)
  local t, ck = cfg.train, cfg.checkpoint
  if t.spike_zscore > 0 and not t.loss_guard then
    config.error("train.spike_zscore=%g needs train.loss_guard=true (the guard skips the spikes)",
                 t.spike_zscore)
  end
  if ck.async and not ck.dir then
    config.error("checkpoint.async needs checkpoint.dir (where checkpoints go)")
  end
  if ck.save_delay_ms > 0 and ck.async then
    config.error("checkpoint.save_delay_ms holds back synchronous saves; with checkpoint.async=true " ..
                 "use checkpoint.async_delay_ms")
  end
  if ck.async_delay_ms > 0 and not ck.async then
    config.error("checkpoint.async_delay_ms holds back the writer thread of checkpoint.async=true; " ..
                 "for synchronous saves use checkpoint.save_delay_ms")
  end
end)

return {
  train = {
    loss_guard = { type = "bool", default = true,
      doc = "skip a step whose loss or gradients are NaN/Inf (or a spike); roll back after max_bad_steps in a row" },
    spike_zscore = { type = "num", default = 0, min = 0,
      doc = "a loss this many standard deviations above the last spike_window steps' mean is a spike (0: off)" },
    spike_window = { type = "int", default = 50, min = 2,
      doc = "good steps whose losses the spike test compares against" },
    max_bad_steps = { type = "int", default = 3, min = 1,
      doc = "bad steps in a row that roll back to the latest checkpoint and skip their data" },
    inject_nan_step = { type = "int", default = 0, min = 0,
      doc = "test switch: the batch at this data position gives a NaN loss (0: off)" },
    inject_nan_count = { type = "int", default = 1, min = 1,
      doc = "test switch: this many batches from inject_nan_step on give a NaN loss" },
    inject_crash_step = { type = "int", default = 0, min = 0,
      doc = "test switch: the run fails when it reaches this step (0: off)" },
  },
  checkpoint = {
    async = { type = "bool", default = false,
      doc = "copy the state to host memory at the step and write it on a background thread" },
    async_delay_ms = { type = "int", default = 0, min = 0,
      doc = "test switch: the writer thread waits this long before writing" },
    save_delay_ms = { type = "int", default = 0, min = 0,
      doc = "test switch: a synchronous save waits this long between writing its files and publishing them (its .tmp directory stays)" },
  },
}
