-- The residual add + norm on the CPU, fused (F.add_rms_norm / F.add_layer_norm, one pass
-- over memory, what every transformer block runs) against the two ops apart (F.add then
-- F.rmsnorm / F.layernorm, what the blocks ran before), forward and backward, f32, in
-- one process: the two take turns, 5 warm-up rounds then the median of ROUNDS rounds.
--   build/tetra run tools/bench/fused_norm.lua [--set bench.rows=4096 --set bench.dim=768]
-- Prints one line per norm: both times and unfused / fused (above 1: the fused is faster).
local tetra = require("tetra")
local F = tetra.nn.functional
local now = tetra.metrics.now

local median = tetra.metrics.median

return {
  name = "bench_fused_norm",
  defaults = { bench = { rows = 4096, dim = 768, rounds = 31 } },
  run = function(cfg)
    local N, D, rounds = cfg.bench.rows, cfg.bench.dim, cfg.bench.rounds
    local x, r = F.parameter(F.randn({ N, D }, 1.0)), F.parameter(F.randn({ N, D }, 1.0))
    local w, b = F.parameter(F.randn({ D }, 0.5)), F.parameter(F.randn({ D }, 0.5))
    local g = F.randn({ N, D }, 1.0)
    local norms = {
      rmsnorm = {
        fused = function() return F.add_rms_norm(x, r, w, 1e-5) end,
        apart = function()
          local h = F.add(x, r)
          return h, F.rmsnorm(h, w, 1e-5)
        end,
      },
      layernorm = {
        fused = function() return F.add_layer_norm(x, r, w, b, 1e-5) end,
        apart = function()
          local h = F.add(x, r)
          return h, F.layernorm(h, w, b, 1e-5)
        end,
      },
    }
    print(string.format("# rows %d, dim %d, f32, OMP_NUM_THREADS=%s", N, D,
                        os.getenv("OMP_NUM_THREADS") or "unset (all cores)"))
    for _, name in ipairs({ "rmsnorm", "layernorm" }) do
      local times = { fused = {}, apart = {} }
      for round = 1, 5 + rounds do
        local order = round % 2 == 0 and { "fused", "apart" } or { "apart", "fused" }
        for _, kind in ipairs(order) do
          local t0 = now()
          local h, y = norms[name][kind]()
          y:backward(g)
          local t = now() - t0
          h:free(); y:free()
          for _, p in ipairs({ x, r, w, b }) do p:zero_grad() end
          if round > 5 then table.insert(times[kind], t) end
        end
      end
      local fused, apart = median(times.fused), median(times.apart)
      print(string.format("add+%s fwd+bwd: fused %.2f ms, apart %.2f ms, apart / fused %.2f",
                          name, fused * 1e3, apart * 1e3, apart / fused))
    end
  end,
}
