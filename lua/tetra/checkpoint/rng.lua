-- tetra.checkpoint.rng: the engine's RNG state in state.json, as 16 hex digits (a uint64
-- does not fit a JSON number).
local ffi = require("ffi")
local C = require("tetra.ffi").C

local M = {}

-- The engine RNG's state now, as text.
function M.state_text()
  return bit.tohex(C.tt_rng_state(), 16)
end

-- Sets the engine RNG's state from text state_text wrote; false when it is not such text.
function M.restore(text)
  local hi, lo = tonumber(text:sub(1, 8), 16), tonumber(text:sub(9, 16), 16)
  if #text ~= 16 or not hi or not lo then return false end
  C.tt_rng_set_state(ffi.new("uint64_t", hi) * 0x100000000ULL + lo)
  return true
end

return M
