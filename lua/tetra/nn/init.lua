-- tetra.nn: modules for building models. Layers hold parameters and define forward only;
-- the engine's autograd tape provides backward.
--
--   local nn = require("tetra").nn
--   local mlp = nn.SwiGLU{ dim = 256, hidden = 768 }
--   local y = mlp(x)
local layers = require("tetra.nn.layers")
local transformer = require("tetra.nn.transformer")

local nn = {
  Module = require("tetra.nn.module"),
  functional = require("tetra.nn.functional"),
}
nn.F = nn.functional

for _, lib in ipairs({ layers, transformer }) do
  for name, cls in pairs(lib) do nn[name] = cls end
end

-- Standard deviation for residual output projections (attention wo, MLP w2 / c_proj):
-- 0.02 / sqrt(2 * n_layers), so the residual stream's variance does not grow with depth.
function nn.residual_std(n_layers, std)
  return (std or 0.02) / math.sqrt(2 * n_layers)
end

return nn
