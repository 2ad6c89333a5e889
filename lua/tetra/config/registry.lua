-- tetra.config.registry: what the config's extensions (lua/tetra/config/schema/*.lua)
-- reach tetra.config through. tetra.config loads those files, so they cannot require it
-- back: they raise config errors and register their cross-key checks and model sources
-- here, and tetra.config (which re-exports all of it) runs them.
local errors = require("tetra.util.errors")

local M = {}

-- Config errors are user errors (tetra.util.errors) of kind "config": every rank finds
-- them alike, so rank 0 alone prints them (config.report).

-- Raises msg as it is, as a user-facing error of the config (a missing or unparsable
-- file); main.c prints its message without a traceback.
function M.raise(msg)
  error(errors.new(msg, "config"), 0)
end

-- Raises a config error.
function M.error(fmt, ...) M.raise("config error: " .. fmt:format(...)) end

function M.is_error(e) return errors.is(e, "config") end

-- fn(cfg) raises through config.error when the merged config is impossible. A named check
-- can also be run alone (run_check): tetra.train runs those of what it does for a config
-- built in code, which has not met config.validate.
M.checks, M.named_checks = {}, {}
function M.register_check(fn, name)
  M.checks[#M.checks + 1] = fn
  if name then M.named_checks[name] = fn end
end
function M.run_check(name, cfg) M.named_checks[name](cfg) end

-- fn(merged, user) fills merged.model from a model the config names (model.init_from)
-- before validation; user is the YAML and --set layer, whose model keys must agree.
M.model_sources = {}
function M.register_model_source(fn) M.model_sources[#M.model_sources + 1] = fn end

return M
