-- tetra.repl.show: how the REPL shows values: tables and tensors as text (a shard with
-- the whole parameter it belongs to), and the statistics inspect() prints.
local M = {}

-- -- Printing values -----------------------------------------------------------------

function M.is_tensor(v)
  return type(v) == "cdata" and require("tetra.tensor").is_tensor(v)
end
local is_tensor = M.is_tensor

-- The placement of a tensor that is a model parameter (set by the session when a
-- recipe's parallelism gave its parameters placements, M.set_placements), nil otherwise.
local placement_of = function() return nil end
function M.set_placements(fn) placement_of = fn end

function M.shard_header(t)
  local pl = placement_of(t)
  if not (pl and pl.split) then return nil end
  local shape = "[" .. table.concat(pl.shape, ", ") .. "]"
  return ("shard of %s %s: dim %d, [%d, %d) of %d"):format(pl.name or "?", shape, pl.dim,
    pl.offset, pl.offset + pl.length, pl.shape[pl.dim + 1])
end

local function pretty(v, depth, seen)
  depth, seen = depth or 0, seen or {}
  if type(v) == "string" then return depth == 0 and v or ("%q"):format(v) end
  if depth == 0 and is_tensor(v) then
    local head = M.shard_header(v)
    if head then return head .. "\n" .. tostring(v) end
  end
  if type(v) ~= "table" then return tostring(v) end
  local mt = getmetatable(v)
  if mt and mt.__tostring then return tostring(v) end
  if seen[v] or depth >= 2 then return tostring(v) end
  seen[v] = true
  local parts, n = {}, 0
  for i, x in ipairs(v) do
    n = i
    if i > 16 then parts[#parts + 1] = "... (" .. #v .. " items)"; break end
    parts[#parts + 1] = pretty(x, depth + 1, seen)
  end
  local keys = {}
  for k in pairs(v) do
    if not (type(k) == "number" and k >= 1 and k <= n and k % 1 == 0) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for i, k in ipairs(keys) do
    if i > 24 then parts[#parts + 1] = "... (" .. #keys .. " keys)"; break end
    local name = type(k) == "string" and k:match("^[%a_][%w_]*$") and k or ("[" .. pretty(k, 2) .. "]")
    parts[#parts + 1] = name .. " = " .. pretty(v[k], depth + 1, seen)
  end
  local indent = ("  "):rep(depth)
  local one_line = "{" .. table.concat(parts, ", ") .. "}"
  if #one_line <= 100 then return one_line end
  return "{\n" .. indent .. "  " .. table.concat(parts, ",\n" .. indent .. "  ") .. "\n" .. indent .. "}"
end
M.pretty = pretty

-- -- Inspection helpers --------------------------------------------------------------

function M.tensor_stats(t)
  local tetra = require("tetra")
  return tetra.no_grad(function()
    local f = t.dtype == "f32" and t or t:float()
    local n = f:numel()
    local mean = f:mean():item()
    local sq = (f * f):sum():item()
    local var = n > 0 and math.max(sq / n - mean * mean, 0) or 0
    local mx = f:max():item()
    local mn = -((-f):max():item())
    return { shape = t:shape(), dtype = t.dtype, norm = math.sqrt(sq), mean = mean,
             std = math.sqrt(var), min = mn, max = mx }
  end)
end

function M.shape_str(s) return "[" .. table.concat(s, ", ") .. "]" end

function M.stats_line(st)
  return ("%-16s %s  norm %.4g  mean %.4g  std %.4g  min %.4g  max %.4g"):format(
    M.shape_str(st.shape), st.dtype, st.norm, st.mean, st.std, st.min, st.max)
end

function M.module_name(model, mod)
  if not (model and model.named_modules) then return nil end
  for _, nm in ipairs(model:named_modules()) do
    if nm[2] == mod then return nm[1] end
  end
end

return M
