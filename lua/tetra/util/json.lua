-- tetra.util.json: the one JSON codec of the Lua side (the C side has its own reader,
-- engine/common/).
--
--   json.encode(v [, opts])   -- text on one line
--   json.decode(text)         -- the value; JSON null is json.null; raises "offset N: ..."
--
-- encode writes a table with #t > 0, or an empty one, as an array, any other as an
-- object whose keys are sorted (opts.first: keys that come first, in that order: the
-- metrics file's contract fields), leaving out values JSON cannot hold (functions,
-- userdata, cdata). Integers below 2^53 are written as integers, other numbers with
-- "%.17g", which reads back as the same double (checkpoints rely on it: state.json's
-- loss window, the FP8 scales), or with opts.float ("%.9g" for the metrics file, whose
-- readers want short numbers); NaN and infinities become null.
local M = {}

-- -- Encoding --------------------------------------------------------------------------

local function encode_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    if c == '"' or c == "\\" then return "\\" .. c end
    return string.format("\\u%04x", c:byte())
  end) .. '"'
end

local function encodable(v)
  local t = type(v)
  return t ~= "function" and t ~= "userdata" and t ~= "cdata"
end

-- The object's keys as strings, opts.first's (those present) first, then the rest sorted.
local function sorted_keys(v, opts)
  local rank = opts.rank
  local keys = {}
  for k, x in pairs(v) do
    if encodable(x) then keys[#keys + 1] = tostring(k) end
  end
  table.sort(keys, function(a, b)
    local ra, rb = rank[a] or math.huge, rank[b] or math.huge
    if ra ~= rb then return ra < rb end
    return a < b
  end)
  return keys
end

local encode_value

local function encode_table(v, opts)
  local parts = {}
  if #v > 0 or next(v) == nil then
    for i = 1, #v do parts[i] = encode_value(v[i], opts) end
    return "[" .. table.concat(parts, ",") .. "]"
  end
  for i, k in ipairs(sorted_keys(v, opts)) do
    parts[i] = encode_string(k) .. ":" .. encode_value(v[k], opts)
  end
  return "{" .. table.concat(parts, ",") .. "}"
end

function encode_value(v, opts)
  local t = type(v)
  if t == "table" then return encode_table(v, opts) end
  if t == "string" then return encode_string(v) end
  if t == "boolean" then return tostring(v) end
  if t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return "null" end
    if v == math.floor(v) and math.abs(v) < 2^53 then return string.format("%d", v) end
    return string.format(opts.float, v)
  end
  return "null"
end

local DEFAULTS = { float = "%.17g", rank = {} }

-- Options as encode_value reads them: the float format and each first key's rank.
local function resolve(opts)
  if not opts then return DEFAULTS end
  local rank = {}
  for i, k in ipairs(opts.first or {}) do rank[k] = i end
  return { float = opts.float or DEFAULTS.float, rank = rank }
end

function M.encode(v, opts)
  return encode_value(v, resolve(opts))
end

-- -- Decoding --------------------------------------------------------------------------

M.null = setmetatable({}, { __tostring = function() return "null" end })

local escapes = { b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }
local words = { ["true"] = true, ["false"] = false, null = M.null }

function M.decode(s)
  local pos = 1
  local function err(what) error(("offset %d: %s"):format(pos, what), 0) end
  local function ws() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local value
  local function str()
    local out = {}
    pos = pos + 1
    while true do
      local c = s:sub(pos, pos)
      if c == "" then err("unterminated string") end
      if c == '"' then pos = pos + 1; return table.concat(out) end
      if c == "\\" then
        local e = s:sub(pos + 1, pos + 1)
        if e == "u" then
          local code = tonumber(s:sub(pos + 2, pos + 5), 16) or err("bad \\u escape")
          out[#out + 1] = code < 128 and string.char(code) or "?"
          pos = pos + 6
        else
          out[#out + 1] = escapes[e] or e
          pos = pos + 2
        end
      else
        out[#out + 1] = c
        pos = pos + 1
      end
    end
  end
  local function object()
    local obj = {}
    pos = pos + 1; ws()
    if s:sub(pos, pos) == "}" then pos = pos + 1; return obj end
    while true do
      ws()
      if s:sub(pos, pos) ~= '"' then err("expected a key") end
      local k = str()
      ws()
      if s:sub(pos, pos) ~= ":" then err("expected ':'") end
      pos = pos + 1
      obj[k] = value()
      ws()
      local d = s:sub(pos, pos)
      pos = pos + 1
      if d == "}" then return obj end
      if d ~= "," then err("expected ',' or '}'") end
    end
  end
  local function array()
    local arr = {}
    pos = pos + 1; ws()
    if s:sub(pos, pos) == "]" then pos = pos + 1; return arr end
    while true do
      arr[#arr + 1] = value()
      ws()
      local d = s:sub(pos, pos)
      pos = pos + 1
      if d == "]" then return arr end
      if d ~= "," then err("expected ',' or ']'") end
    end
  end
  function value()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then return object() end
    if c == "[" then return array() end
    if c == '"' then return str() end
    for word, v in pairs(words) do
      if s:sub(pos, pos + #word - 1) == word then pos = pos + #word; return v end
    end
    local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
    if not num or num == "" or not tonumber(num) then err("unexpected character") end
    pos = pos + #num
    return tonumber(num)
  end
  local v = value()
  ws()
  if pos <= #s then err("trailing characters") end
  return v
end

return M
