-- tetra.parallel.micro: a step's rows as micro-batches, and their losses summed, for both
-- step strategies (tetra.parallel.step's plain one and tetra.parallel.pipeline's).
--
--   micro.rows(tokens, m, n)     -- micro-batch m of tokens: rows [m n, (m + 1) n)
--   sum = micro.add_loss(sum, loss)
local F = require("tetra.nn.functional")

local free = F.free
local M = {}

-- Micro-batch m of tokens (B, T + 1): rows [m n, (m + 1) n), contiguous (tokens itself
-- when that is every row).
function M.rows(tokens, m, n)
  if n == tonumber(tokens._shape[0]) then return tokens end
  local v = F.narrow(tokens, 0, m * n, n)
  local c = F.contiguous(v)
  free(v)
  return c
end

-- sum (nil at first) + a micro-batch's loss, off the tape and where they are: nothing
-- waits for the device. Returns the new sum.
function M.add_loss(sum, loss)
  local value = F.detach(loss)
  if not sum then return value end
  local s = F.add(sum, value)
  free(sum); free(value)
  return s
end

return M
