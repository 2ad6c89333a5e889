-- tetra.io: safetensors files from Lua (engine/io/safetensors.c).
--
--   local st = tetra.io
--   st.save("w.safetensors", { ["wte.weight"] = w, bias = b }, { step = "10" })
--   local tensors, meta = st.load("w.safetensors")        -- name -> tensor, metadata
--   local f = st.open("w.safetensors")                   -- lazy access
--   f:names(), f:info(name) -> {dtype =, shape =}, f:read(name), f:read_into(name, t),
--   f:read_box(name, lo, hi, t) (a part), f:box_span(name, lo, hi), f:metadata(), f:close()

local ffi = require("ffi")
local tffi = require("tetra.ffi").cdef_header("tetra_io.h")
local tensor = require("tetra.tensor")
local C = ffi.C

local M = {}

-- Strings whose addresses C is reading during a save; an upvalue keeps them reachable.
local anchored = nil

local function fail()
  error(ffi.string(C.tt_last_error()), 3)
end

local File = {}
File.__index = File

function M.open(path)
  local box = ffi.new("tt_safetensors *[1]")
  if C.tt_safetensors_open(path, box) ~= 0 then fail() end
  return setmetatable({ handle = ffi.gc(box[0], C.tt_safetensors_close), path = path }, File)
end

function File:names()
  local out = {}
  for i = 0, C.tt_safetensors_count(self.handle) - 1 do
    out[#out + 1] = ffi.string(C.tt_safetensors_name(self.handle, i))
  end
  return out
end

function File:has(name) return C.tt_safetensors_find(self.handle, name) >= 0 end

-- { dtype = "f32" (or the file's name for dtypes Tetra lacks: nil), shape = {...} }
function File:info(name)
  local i = C.tt_safetensors_find(self.handle, name)
  if i < 0 then error(("%s has no tensor '%s'"):format(self.path, name), 2) end
  local dt, nd = ffi.new("int[1]"), ffi.new("int[1]")
  local shape = ffi.new("int64_t[8]")
  tffi.check(C.tt_safetensors_info(self.handle, i, dt, shape, nd), 3)
  local s = {}
  for d = 0, nd[0] - 1 do s[d + 1] = tonumber(shape[d]) end
  return { dtype = dt[0] >= 0 and ffi.string(C.tt_dtype_name(dt[0])) or nil, shape = s }
end

function File:read(name)
  if C.tt_safetensors_read(self.handle, name, tensor.pout) ~= 0 then fail() end
  local p = tensor.pout[0]
  tensor.pout[0] = nil
  return tensor.wrap(p)
end

function File:read_into(name, t)
  if C.tt_safetensors_read_into(self.handle, name, t) ~= 0 then fail() end
  return t
end

-- Where the tensor data starts in the file (the header is the bytes before it).
function File:data_start()
  return tonumber(C.tt_safetensors_data_start(self.handle))
end

-- The box of tensor `name` whose dim d (1-based here) spans [lo[d], hi[d]) (0-based
-- bounds, each non-empty): box_span -> the file bytes [begin, end) it lies in;
-- read_box copies it into t (shaped hi - lo), reading only the box's elements.
local lo_box, hi_box = ffi.new("int64_t[8]"), ffi.new("int64_t[8]")
local span_box = ffi.new("uint64_t[2]")
local function set_box(lo, hi)
  for d = 1, #lo do lo_box[d - 1], hi_box[d - 1] = lo[d], hi[d] end
end

function File:box_span(name, lo, hi)
  set_box(lo, hi)
  if C.tt_safetensors_box_span(self.handle, name, lo_box, hi_box, span_box, span_box + 1) ~= 0 then
    fail()
  end
  return tonumber(span_box[0]), tonumber(span_box[1])
end

function File:read_box(name, lo, hi, t)
  set_box(lo, hi)
  if C.tt_safetensors_read_box(self.handle, name, lo_box, hi_box, t) ~= 0 then fail() end
  return t
end

function File:metadata()
  local out = {}
  for i = 0, C.tt_safetensors_metadata_count(self.handle) - 1 do
    local k = ffi.string(C.tt_safetensors_metadata_key(self.handle, i))
    out[k] = ffi.string(C.tt_safetensors_metadata_get(self.handle, k))
  end
  return out
end

function File:close()
  if self.handle then
    C.tt_safetensors_close(ffi.gc(self.handle, nil))
    self.handle = nil
  end
end

-- Every tensor of the file: returns { name = tensor }, metadata.
function M.load(path)
  local f = M.open(path)
  local out = {}
  for _, name in ipairs(f:names()) do out[name] = f:read(name) end
  local meta = f:metadata()
  f:close()
  return out, meta
end

-- tensors: { name = tensor } (written in sorted name order) or an array of
-- { name, tensor } pairs (kept in order). metadata: { string = string } or nil. sums: a
-- tt_file_sums to fill with the file's CRC-32C, whole and per block, taken as it is
-- written (tt_safetensors_save_summed; free its sums with tt_file_sums_free), or nil.
function M.save(path, tensors, metadata, sums)
  local pairs_list = {}
  if #tensors > 0 then
    for i, p in ipairs(tensors) do pairs_list[i] = p end
  else
    local names = {}
    for k in pairs(tensors) do names[#names + 1] = k end
    table.sort(names)
    for i, k in ipairs(names) do pairs_list[i] = { k, tensors[k] } end
  end
  local n = #pairs_list
  local names = ffi.new("const char *[?]", math.max(n, 1))
  local ts = ffi.new("tt_tensor *[?]", math.max(n, 1))
  local keep = {}
  for i, p in ipairs(pairs_list) do
    keep[#keep + 1] = p[1]
    names[i - 1] = p[1]
    ts[i - 1] = p[2]
  end
  local mk, mv, nm = nil, nil, 0
  if metadata then
    local keys = {}
    for k in pairs(metadata) do keys[#keys + 1] = k end
    table.sort(keys)
    nm = #keys
    mk = ffi.new("const char *[?]", math.max(nm, 1))
    mv = ffi.new("const char *[?]", math.max(nm, 1))
    for i, k in ipairs(keys) do
      local v = tostring(metadata[k])
      keep[#keep + 1] = v
      mk[i - 1], mv[i - 1] = k, v
    end
  end
  anchored = keep
  local rc = sums and C.tt_safetensors_save_summed(path, names, ts, n, mk, mv, nm, sums)
               or C.tt_safetensors_save(path, names, ts, n, mk, mv, nm)
  anchored = nil
  if rc ~= 0 then fail() end
  return path
end

return M
