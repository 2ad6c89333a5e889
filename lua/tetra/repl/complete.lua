-- tetra.repl.complete: Tab completion of the word before the cursor: globals and
-- keywords, fields after `.`, methods after `:` (a tensor's, a module's and its classes').
local show = require("tetra.repl.show")

local M = {}

local KEYWORDS = { "and", "break", "do", "else", "elseif", "end", "false", "for",
                   "function", "goto", "if", "in", "local", "nil", "not", "or", "repeat",
                   "return", "then", "true", "until", "while" }

-- Identifier keys of v and of the tables its metatable's __index chain reaches (a
-- module's class and base classes; _G behind the session env); a tensor's methods.
-- Functions only when methods_only.
local function fields_of(v, methods_only)
  local out, seen = {}, {}
  local function add(k, val)
    if type(k) == "string" and k:match("^[%a_][%w_]*$") and not seen[k] and
       (not methods_only or type(val) == "function") then
      seen[k] = true
      out[#out + 1] = k
    end
  end
  if show.is_tensor(v) then
    for k, f in pairs(require("tetra.tensor").methods) do add(k, f) end
    return out
  end
  local t = v
  for _ = 1, 8 do
    if type(t) ~= "table" then break end
    for k, val in pairs(t) do add(k, val) end
    local mt = getmetatable(t)
    local idx = type(mt) == "table" and rawget(mt, "__index") or nil
    if idx == t then break end
    t = idx
  end
  return out
end

-- The value a path such as `model.layers[1].attention` names, by indexing only (nothing
-- is called); nil when it names nothing.
local function resolve(env, path)
  local name, pos = path:match("^([%a_][%w_]*)()")
  if not name then return nil end
  local ok, v = pcall(function() return env[name] end)
  if not ok then return nil end
  while pos <= #path do
    local key, nxt = path:match("^%.([%a_][%w_]*)()", pos)
    if not key then
      key, nxt = path:match("^%[(%d+)%]()", pos)
      key = tonumber(key)
    end
    if not key then
      key, nxt = path:match('^%["([^"]*)"%]()', pos)
    end
    if key == nil or v == nil then return nil end
    if type(v) ~= "table" and not show.is_tensor(v) then return nil end
    ok, v = pcall(function() return v[key] end)
    if not ok then return nil end
    pos = nxt
  end
  return v
end

-- Candidates for the word before the cursor (each a whole replacement of the word).
function M.completions(env, word)
  local out = {}
  local prefix, sep, partial = word:match("^(.*)([%.:])([%w_]*)$")
  if prefix then
    local v = resolve(env, prefix)
    if v == nil then return out end
    for _, k in ipairs(fields_of(v, sep == ":")) do
      if k:sub(1, #partial) == partial then out[#out + 1] = prefix .. sep .. k end
    end
  else
    local names = fields_of(env)
    for _, k in ipairs(KEYWORDS) do names[#names + 1] = k end
    for _, k in ipairs(names) do
      if k:sub(1, #word) == word then out[#out + 1] = k end
    end
  end
  table.sort(out)
  return out
end

return M
