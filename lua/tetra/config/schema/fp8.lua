-- Configuration keys of FP8 training (train.precision = fp8), read by lua/tetra/optim/amp.lua.
-- tetra.config loads every file of this folder: each returns { section = { key = spec } }.
local config = require("tetra.config.registry")

-- "all", or globs ("*" any run of characters) as a list or one comma-separated string.
config.register_check(function(cfg)
  local v = cfg.train and cfg.train.fp8_layers
  if v == nil or v == "all" then return end
  if cfg.train.precision ~= "fp8" then
    config.error("train.fp8_layers applies to train.precision=fp8 (this run is %s): " ..
                 "drop it or set train.precision=fp8", tostring(cfg.train.precision))
  end
  local ok = type(v) == "string" and v:match("%S")
  if type(v) == "table" then
    ok = #v > 0
    for _, g in ipairs(v) do ok = ok and type(g) == "string" and g:match("%S") end
  end
  if not ok then
    config.error("train.fp8_layers must be \"all\" or module-path globs (a list, or one " ..
                 "comma-separated string such as layers.*.attention.*), got %s", tostring(v))
  end
end)

-- Fast accumulation is a property of Hopper's FP8 tensor-core GEMMs that the CPU
-- emulation does not model: refused off CUDA rather than ignored.
config.register_check(function(cfg)
  local t = cfg.train or {}
  if not t.fp8_fast_accum then return end
  if t.precision ~= "fp8" then
    config.error("train.fp8_fast_accum applies to train.precision=fp8 (this run is %s): " ..
                 "drop it or set train.precision=fp8", tostring(t.precision))
  end
  if not tostring(t.device):match("^cuda") then
    config.error("train.fp8_fast_accum is an option of cuBLASLt's FP8 GEMMs on CUDA; the " ..
                 "CPU emulation (train.device=%s) sums in fp32: drop it or set train.device=cuda",
                 tostring(t.device))
  end
end)

return {
  train = {
    fp8_fast_accum = { type = "bool", default = false,
                       doc = "fp8: the forward GEMMs use cuBLASLt's fast accumulation " ..
                             "(faster, sums in reduced precision; CUDA only)" },
    fp8_layers = { type = "any", default = "all",
                   doc = "fp8: the Linear layers that run in FP8: \"all\" (every Linear " ..
                         "except the language-model head) or module-path globs, e.g. " ..
                         "layers.*.feed_forward.*; the others stay f32" },
  },
}
