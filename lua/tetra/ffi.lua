-- tetra.ffi: feeds the engine's public headers to ffi.cdef, once.
--
-- engine/tetra.h is flat C written for this loader: its `#include "x.h"` lines are
-- inlined, every other preprocessor line is dropped, and `#ifdef __cplusplus` blocks are
-- skipped. A header is declared at most once per process, so module headers that
-- include tetra.h (tetra_amp.h, tetra_data.h, ...) can be loaded in any order.
--
-- One rewrite happens on the way: the fields of `struct tt_tensor` get a leading
-- underscore (`_shape`, `_grad`, `_dtype` ...). The layout is unchanged, but the plain
-- names become free for the tensor metatype (tetra.tensor), so `t:shape()`, `t.grad`
-- (a tensor or nil) and `t.dtype` (a name) behave like Lua values rather than raw C
-- fields.

local ffi = require("ffi")
local host = require("tetra.host")
local read_file = require("tetra.util.fs").read_file

local M = { ffi = ffi, C = ffi.C }

-- Directories searched for headers, best first.
local function header_roots()
  local roots, seen = {}, {}
  local function add(dir)
    if dir and dir ~= "" and not seen[dir] then
      seen[dir] = true
      roots[#roots + 1] = dir
    end
  end
  add(os.getenv("TETRA_HOME") and (os.getenv("TETRA_HOME") .. "/engine"))
  add(host.root .. "/engine")
  add(host.source_dir .. "/engine")
  return roots
end

local function dirname(path)
  return path:match("^(.*)/[^/]*$") or "."
end

-- Resolves a header name ("tetra.h", "tetra_data.h", "engine/tetra_io.h") to a
-- readable path, trying the including file's directory first.
local function find_header(name, from_dir)
  if name:sub(1, 1) == "/" then
    return read_file(name) and name or nil
  end
  local rel = name:gsub("^engine/", "")
  if from_dir then
    local p = from_dir .. "/" .. rel
    if read_file(p) then return p end
  end
  for _, root in ipairs(header_roots()) do
    local p = root .. "/" .. rel
    if read_file(p) then return p end
  end
  return nil
end

-- Canonical key for "already declared": the path relative to its engine root, so the
-- same header reached through two roots or two relative spellings counts once.
local function header_key(path)
  for _, root in ipairs(header_roots()) do
    if path:sub(1, #root + 1) == root .. "/" then return path:sub(#root + 2) end
  end
  return path
end

local declared = {}   -- header_key -> true

local function rename_tensor_fields(src)
  return (src:gsub("(typedef%s+struct%s+tt_tensor%s*{)(.-)(}%s*tt_tensor%s*;)",
    function(head, body, tail)
      body = body:gsub("/%*.-%*/", "")
      local lines = {}
      for line in body:gmatch("[^\n]+") do
        if line:find("[", 1, true) then
          line = line:gsub("([%a_][%w_]*)(%s*%[[^%]]*%]%s*;%s*)$", "_%1%2")
        else
          line = line:gsub("([%a_][%w_]*)(%s*;%s*)$", "_%1%2")
        end
        lines[#lines + 1] = line
      end
      return head .. "\n" .. table.concat(lines, "\n") .. "\n" .. tail
    end))
end

-- Appends the header's lines to `out` with includes inlined (each header once) and
-- preprocessor lines removed; `added` collects the headers marked declared. Conditional
-- blocks are kept whole (both branches), except C++/CUDA-only ones, so public headers
-- must not declare things conditionally.
local function expand(path, out, added)
  local key = header_key(path)
  if declared[key] then return end
  declared[key] = true
  added[#added + 1] = key
  local src = assert(read_file(path))
  local dir = dirname(path)
  local skip = 0        -- depth of the #if block being skipped (0: none)
  local depth = 0       -- depth of #if blocks overall, to match #endif
  for line in (src .. "\n"):gmatch("([^\n]*)\n") do
    local directive = line:match("^%s*#%s*(%a+)")
    if directive then
      if directive == "if" or directive == "ifdef" or directive == "ifndef" then
        depth = depth + 1
        if skip == 0 and (line:find("__cplusplus", 1, true) or line:find("__CUDACC__", 1, true)) then
          skip = depth
        end
      elseif directive == "endif" then
        if skip == depth then skip = 0 end
        depth = depth - 1
      elseif directive == "include" and skip == 0 then
        local name = line:match('#%s*include%s*"([^"]+)"')
        if name then
          local inc = find_header(name, dir)
          if not inc then error("tetra.ffi: " .. path .. " includes \"" .. name .. "\", not found", 0) end
          expand(inc, out, added)
        end
      end
    elseif skip == 0 then
      out[#out + 1] = line
    end
  end
end

-- Declares one header (and whatever it includes that was not declared yet).
-- `name` is relative to engine/ ("tetra_io.h", "tetra_data.h") or absolute.
function M.cdef_header(name)
  local path = find_header(name)
  if not path then
    error("tetra.ffi: header " .. name .. " not found under " ..
          table.concat(header_roots(), ", ") .. " (set TETRA_HOME)", 2)
  end
  if declared[header_key(path)] then return M end
  local out, added = {}, {}
  local ok, err = pcall(expand, path, out, added)
  if ok then ok, err = pcall(ffi.cdef, rename_tensor_fields(table.concat(out, "\n"))) end
  if not ok then
    for _, key in ipairs(added) do declared[key] = nil end
    error("tetra.ffi: ffi.cdef of " .. path .. " failed: " .. tostring(err), 2)
  end
  return M
end

-- True when `sym` is declared (cdef_header its header first) and the running binary
-- exports it (optional modules, e.g. CUDA).
function M.has_symbol(sym)
  return (pcall(function() return ffi.C[sym] end))
end

local C = ffi.C

-- Raises the engine's last error when `status` is non-zero, as error(message, level):
-- the default 2 blames the function that called check; wrappers called by users pass 3.
function M.check(status, level)
  if status ~= 0 then
    error(ffi.string(C.tt_last_error()), level or 2)
  end
end

M.cdef_header("tetra.h")

return M
