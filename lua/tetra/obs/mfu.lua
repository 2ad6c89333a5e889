-- tetra.obs.mfu: model FLOPs utilisation, the share of the devices' dense peak a step uses.
--
--   local flops = mfu.flops_per_token(model, cfg.model)   -- the whole model, before it
--                                                         -- is split
--   mfu.flops(n, cfg.model)    -- the same from n, the parameters a token is multiplied
--                              -- by (tetra.planner counts them from the model's shapes)
--   local peak = mfu.peak_tflops(cfg, device_name)        -- per device, nil: unknown
--   r.mfu = flops * tokens_per_s / (peak * 1e12 * world_size)
--
-- FLOPs per token follow the PaLM paper's appendix B: 6 N for the matrix multiplies of
-- forward and backward (N the parameters a token is multiplied by: embedding lookups are
-- not multiplies, a tied head is) plus 12 L d T for attention's two score products
-- (counted whole, as is the custom, although a causal mask skips half of them).
local ffi = require("ffi")
local C = require("tetra.ffi").C
local key = require("tetra.tensor").key

local M = {}

-- Dense peak TFLOP/s per device from the vendors' datasheets (no sparsity), by the
-- precision its GEMMs run in: bf16 (also fp16), fp8, tf32 (fp32 training on tensor
-- cores). Matched against the CUDA device name in this order: the first pattern found
-- wins, so the longer names come first.
M.peaks = {
  { pattern = "GH200",     bf16 = 989.4,  fp8 = 1978.9, tf32 = 494.7 },
  { pattern = "H200 NVL",  bf16 = 835.5,  fp8 = 1671,   tf32 = 417.5 },
  { pattern = "H200",      bf16 = 989.4,  fp8 = 1978.9, tf32 = 494.7 },
  { pattern = "H100 NVL",  bf16 = 835.5,  fp8 = 1671,   tf32 = 417.5 },
  { pattern = "H100 PCIe", bf16 = 756.5,  fp8 = 1513,   tf32 = 378 },
  { pattern = "H100",      bf16 = 989.4,  fp8 = 1978.9, tf32 = 494.7 },   -- SXM5
  { pattern = "H800",      bf16 = 989.4,  fp8 = 1978.9, tf32 = 494.7 },
  { pattern = "B200",      bf16 = 2250,   fp8 = 4500,   tf32 = 1100 },
  { pattern = "A100",      bf16 = 312,    tf32 = 156 },
  { pattern = "A800",      bf16 = 312,    tf32 = 156 },
  { pattern = "L40S",      bf16 = 362.05, fp8 = 733,    tf32 = 183 },
  { pattern = "L4",        bf16 = 121,    fp8 = 242.5,  tf32 = 60 },
  { pattern = "A10",       bf16 = 125,    tf32 = 62.5 },
}

local PRECISION_COLUMN = { bf16 = "bf16", fp16 = "bf16", fp8 = "fp8", fp32 = "tf32" }

-- Per-device peak TFLOP/s for cfg.train.precision on the device named `device_name`
-- (nil on the CPU): train.peak_tflops when set, else the table's; nil when unknown.
function M.peak_tflops(cfg, device_name)
  local t = cfg.train or {}
  if t.peak_tflops then return t.peak_tflops end
  if not device_name then return nil end
  local column = PRECISION_COLUMN[t.precision or "fp32"]
  for _, row in ipairs(M.peaks) do
    if device_name:find(row.pattern, 1, true) then return row[column] end
  end
  return nil
end

-- The CUDA device's name, or nil on the CPU.
function M.device_name(dev)
  if dev == C.TT_CPU then return nil end
  local buf = ffi.new("char[256]")
  if C.tt_cuda_device_info(dev, buf, 256) ~= 0 then return nil end
  return ffi.string(buf)
end

-- Training FLOPs per token of the whole model (call before tetra.parallel splits it).
function M.flops_per_token(model, m)
  local n = model:num_params()
  local modules = model:named_modules()
  for _, nm in ipairs(modules) do
    local e = nm[2]
    if e.__name == "Embedding" then   -- a lookup, unless the head multiplies by it
      local shared = false
      for _, other in ipairs(modules) do
        local o = other[2]
        if o.__name ~= "Embedding" and o.weight and key(o.weight) == key(e.weight) then
          shared = true
        end
      end
      if not shared then n = n - tonumber(C.tt_tensor_numel(e.weight)) end
    end
  end
  return M.flops(n, m)
end

-- Training FLOPs per token of model m (cfg.model) whose tokens are multiplied by n
-- parameters: 6 n + 12 L d T.
function M.flops(n, m)
  return 6 * n + 12 * m.n_layers * m.dim * m.seq_len
end

return M
