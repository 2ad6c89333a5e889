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

-- cuBLASLt's FP8 GEMMs on CUDA take every leading dimension in multiples of 16 bytes
-- (engine/cuda/fp8_linear.cu; the multiple is tetra.parallel.layout.row_multiple's): each
-- FP8 layer's rows (a micro-batch's tokens on this
-- rank) and its input and output features on its tensor-parallel rank. Checked here, before
-- anything is allocated, rather than at the first forward; the features for the model
-- families the planner knows (tetra.planner.model) with train.fp8_layers=all.
config.register_check(function(cfg)
  local t, m = cfg.train or {}, cfg.model or {}
  local layout = require("tetra.parallel.layout")
  local k = layout.row_multiple(cfg)
  if k == 1 then return end
  local s = layout.sizes(cfg)
  local rows = s.micro_batch and m.seq_len and s.micro_batch * m.seq_len / s.cp
  if rows and rows == math.floor(rows) and rows % k ~= 0 then
    config.error("train.precision=fp8 on %s: the FP8 GEMMs take rows in multiples of %d, and " ..
                 "each layer gets %d (a micro-batch of %d sequences x model.seq_len %d / " ..
                 "context parallel %d): change train.batch_size, " ..
                 "train.gradient_accumulation_steps or model.seq_len so that it is one",
                 tostring(t.device), k, rows, s.micro_batch, m.seq_len, s.cp)
  end
  if t.fp8_layers ~= nil and t.fp8_layers ~= "all" then return end
  local ok, mms = pcall(function() return require("tetra.planner.model").block_matmuls(m, s.tp) end)
  if not ok then return end   -- a model the planner does not know: the first forward says
  for _, mm in ipairs(mms) do
    local inf = mm.weights / mm.out
    if inf % k ~= 0 or mm.out % k ~= 0 then
      config.error("train.precision=fp8 on %s: the FP8 GEMMs take features in multiples of " ..
                   "%d, and %s has %d in and %d out on each of %d tensor-parallel rank(s): " ..
                   "change the model's sizes or parallel.tensor_parallel_size, or leave it " ..
                   "out of FP8 (train.fp8_layers)", tostring(t.device), k, mm.path, inf, mm.out,
                   s.tp)
    end
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
