-- Configuration keys of FP8 training (train.precision = fp8), read by lua/tetra/amp.lua.
-- tetra.config loads every file of this folder: each returns { section = { key = spec } }.
local config = require("tetra.config")

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

return {
  train = {
    fp8_layers = { type = "any", default = "all",
                   doc = "fp8: the Linear layers that run in FP8: \"all\" (every Linear " ..
                         "except the language-model head) or module-path globs, e.g. " ..
                         "layers.*.feed_forward.*; the others stay f32" },
  },
}
