-- The projections that read one input under train.precision=bf16 on the CPU (the
-- emulation of the tensor-core GEMMs: operands rounded to bf16, f32 sums): grouped into
-- one GEMM (tt_linear_lowp_group, what nn.linears runs: q/k/v, w1 | w3) against one GEMM
-- per layer (tt_linear_lowp_ex, what ran before), forward and backward from a bf16 input,
-- in one process: the two take turns, 3 warm-up rounds then the median of ROUNDS rounds.
--   build/tetra run tools/bench/fused_gemm.lua [--set bench.tokens=1024 --set bench.dim=512]
-- Prints one line per group: both times and apart / grouped (above 1: grouped is faster).
local ffi = require("ffi")
local tetra = require("tetra")
local C = require("tetra.ffi").C
local T = require("tetra.tensor")
local F = tetra.nn.functional
local now = tetra.metrics.now

local median = tetra.metrics.median

return {
  name = "bench_fused_gemm",
  defaults = { bench = { tokens = 1024, dim = 512, kv_dim = 128, hidden = 1536, rounds = 11 } },
  run = function(cfg)
    local b = cfg.bench
    local N, D = b.tokens, b.dim
    local x = F.randn({ N, D }, 1.0):cast("bf16"):requires_grad_()
    local groups = {
      { "q/k/v", { b.dim, b.kv_dim, b.kv_dim } },
      { "w1|w3", { b.hidden, b.hidden } },
    }
    local outs = ffi.new("tt_tensor *[3]")
    print(string.format("# %d tokens, dim %d, bf16 emulated on the cpu, OMP_NUM_THREADS=%s",
                        N, D, os.getenv("OMP_NUM_THREADS") or "unset (all cores)"))
    for _, grp in ipairs(groups) do
      local ws, gs = {}, {}
      for i, n in ipairs(grp[2]) do
        ws[i] = F.parameter(F.randn({ n, D }, 0.02))
        gs[i] = F.randn({ N, n }, 1.0):cast("bf16")
      end
      local wa = ffi.new("tt_tensor *[3]", ws)
      local run = {
        grouped = function()
          tetra.ffi.check(C.tt_linear_lowp_group(x, wa, nil, #ws, C.TT_BF16, C.TT_BF16, outs))
          local ys, total = {}, nil
          for i = 1, #ws do
            ys[i] = T.wrap(outs + (i - 1))
            local part = (ys[i]:float() * gs[i]:float()):sum()
            total = total and total + part or part
          end
          total:backward()
        end,
        apart = function()
          local total
          for i = 1, #ws do
            local y = T.take(C.tt_linear_lowp_ex(x, ws[i], nil, C.TT_BF16, C.TT_BF16, T.pout))
            local part = (y:float() * gs[i]:float()):sum()
            total = total and total + part or part
          end
          total:backward()
        end,
      }
      local times = { grouped = {}, apart = {} }
      for round = 1, 3 + b.rounds do
        local order = round % 2 == 0 and { "grouped", "apart" } or { "apart", "grouped" }
        for _, kind in ipairs(order) do
          local t0 = now()
          run[kind]()
          local t = now() - t0
          x:zero_grad()
          for _, w in ipairs(ws) do w:zero_grad() end
          if round > 3 then table.insert(times[kind], t) end
        end
      end
      local g, a = median(times.grouped), median(times.apart)
      print(string.format("%s fwd+bwd: grouped %.2f ms, apart %.2f ms, apart / grouped %.2f",
                          grp[1], g * 1e3, a * 1e3, a / g))
    end
  end,
}
