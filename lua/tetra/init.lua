-- tetra: the Lua library. `local tetra = require("tetra")` gives the tensor functions
-- (tetra.randn, tetra.zeros, tetra.from_table, tetra.no_grad, tetra.matmul ...) and loads
-- the submodules on first use: tetra.nn, tetra.optim, tetra.train, tetra.metrics,
-- tetra.config, tetra.data, tetra.dist, tetra.parallel, tetra.amp, tetra.io. The REPL
-- (tetra.repl) is not one: it is the program above the library, whose prompt gets this
-- table as `tetra`.

local tensor = require("tetra.tensor")
local host = require("tetra.host")

local tetra = {
  tensor = tensor,
  ffi = require("tetra.ffi"),
  host = host,
  version = host.version,
}

-- Tensor functions: tetra.zeros(...) is tensor.zeros(...).
for k, v in pairs(tensor) do
  if type(v) == "function" and k ~= "take" and k ~= "wrap" and k ~= "borrow" and k ~= "raise" then
    tetra[k] = v
  end
end

local submodules = {
  nn = "tetra.nn", optim = "tetra.optim", train = "tetra.train", metrics = "tetra.obs.metrics",
  config = "tetra.config", data = "tetra.data", dist = "tetra.dist",
  parallel = "tetra.parallel", amp = "tetra.optim.amp", io = "tetra.io", spec = "tetra.spec",
}

return setmetatable(tetra, {
  __index = function(t, k)
    local name = submodules[k]
    if not name then return nil end
    local mod = require(name)
    rawset(t, k, mod)
    return mod
  end,
})
