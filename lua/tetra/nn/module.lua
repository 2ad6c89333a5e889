-- tetra.nn.Module: the base of every layer.
--
-- A module is a Lua table holding parameters (leaf tensors that require grad) and child
-- modules, both registered in order so that names and iteration order are stable
-- (`layers.0.attention.wq.weight`, the order PyTorch would use for the same tree).
-- Calling a module runs its forward(...) and then any forward hooks.
--
--   local Scale = nn.Module:extend("Scale")
--   function Scale:init(dim) self:param("weight", F.parameter(F.full({dim}, 1))) end
--   function Scale:forward(x) return F.mul(x, self.weight) end
local ffi = require("ffi")
local C = require("tetra.ffi").C

local Module = { __name = "Module" }
Module.__index = Module

local function call(self, ...)
  local y = self:forward(...)
  local hooks = self._hooks
  if hooks then
    for i = 1, #hooks do
      local replaced = hooks[i](self, y, ...)
      if replaced ~= nil then y = replaced end
    end
  end
  return y
end

local function describe(self)
  return string.format("%s(%d parameters)", self.__name, self:num_params())
end

local function new_instance(cls, ...)
  local self = setmetatable({ _param_names = {}, _child_names = {}, training = true }, cls)
  self:init(...)
  return self
end

-- Creates a subclass. Metamethods are copied because Lua looks them up without __index.
function Module:extend(name)
  local cls = setmetatable({ __name = name }, { __index = self, __call = new_instance })
  cls.__index = cls
  cls.__call = call
  cls.__tostring = describe
  return cls
end

setmetatable(Module, { __call = new_instance })
Module.__call = call
Module.__tostring = describe

function Module:init() end

function Module:forward()
  error(self.__name .. ": forward is not defined", 2)
end

-- -- Registration --------------------------------------------------------------------

function Module:param(name, tensor)
  if self[name] == nil then
    local names = self._param_names
    names[#names + 1] = name
  end
  self[name] = tensor
  return tensor
end

function Module:add(name, module)
  name = tostring(name)
  if self[name] == nil then
    local names = self._child_names
    names[#names + 1] = name
  end
  self[name] = module
  return module
end

-- -- Traversal -----------------------------------------------------------------------

-- Calls fn(name, tensor) for every parameter, children first in registration order.
-- A tensor shared by two modules (tied embeddings) is visited once, under its first name.
local function walk_params(module, prefix, seen, fn)
  for _, n in ipairs(module._param_names) do
    local t = module[n]
    if t ~= nil then
      local key = tostring(ffi.cast("uintptr_t", ffi.cast("void *", t)))
      if not seen[key] then
        seen[key] = true
        fn(prefix .. n, t)
      end
    end
  end
  for _, n in ipairs(module._child_names) do
    walk_params(module[n], prefix .. n .. ".", seen, fn)
  end
end

-- Array of { name, tensor } pairs; iterate with `for _, np in ipairs(m:named_parameters())`
-- or use the iterator form `for name, p in m:iter_parameters()`.
function Module:named_parameters()
  local list = {}
  walk_params(self, "", {}, function(name, t) list[#list + 1] = { name, t } end)
  return list
end

function Module:iter_parameters()
  local list, i = self:named_parameters(), 0
  return function()
    i = i + 1
    local np = list[i]
    if np then return np[1], np[2] end
  end
end

function Module:parameters()
  local list = {}
  walk_params(self, "", {}, function(_, t) list[#list + 1] = t end)
  return list
end

-- Direct children as an array of { name, module }.
function Module:children()
  local list = {}
  for _, n in ipairs(self._child_names) do list[#list + 1] = { n, self[n] } end
  return list
end

-- Every parameter slot of every module of the tree, depth first: { module, name,
-- tensor, path } per slot ("layers.0.attention.wq.weight"), so a tensor two modules hold
-- (tied embeddings) comes once for each.
function Module:param_slots()
  local list = {}
  for _, nm in ipairs(self:named_modules()) do
    local m, prefix = nm[2], nm[1] == "" and "" or nm[1] .. "."
    for _, n in ipairs(m._param_names) do
      if m[n] ~= nil then list[#list + 1] = { m, n, m[n], prefix .. n } end
    end
  end
  return list
end

-- Every module of the tree (self first, named ""), depth first.
function Module:named_modules()
  local list = {}
  local function walk(m, name)
    list[#list + 1] = { name, m }
    for _, n in ipairs(m._child_names) do
      walk(m[n], name == "" and n or name .. "." .. n)
    end
  end
  walk(self, "")
  return list
end

-- The submodule at a dotted path ("layers.0.attention"), or nil.
function Module:get(path)
  local m = self
  for part in string.gmatch(path, "[^.]+") do
    m = m[part]
    if m == nil then return nil end
  end
  return m
end

function Module:num_params()
  local n = 0
  walk_params(self, "", {}, function(_, t) n = n + tonumber(C.tt_tensor_numel(t)) end)
  return n
end

-- -- State ---------------------------------------------------------------------------

function Module:zero_grad()
  walk_params(self, "", {}, function(_, t) C.tt_zero_grad(t) end)
end

function Module:train(mode)
  if mode == nil then mode = true end
  for _, nm in ipairs(self:named_modules()) do nm[2].training = mode end
  return self
end

function Module:eval()
  return self:train(false)
end

-- name -> tensor (the parameters themselves, not copies).
function Module:state_dict()
  local sd = {}
  walk_params(self, "", {}, function(name, t) sd[name] = t end)
  return sd
end

-- Copies tensors from `sd` (name -> tensor) into the parameters. strict (default true):
-- every parameter must be present, with the same number of elements.
function Module:load_state_dict(sd, strict)
  strict = strict ~= false
  local loaded = 0
  walk_params(self, "", {}, function(name, t)
    local src = sd[name]
    if src == nil then
      if strict then error("load_state_dict: missing parameter '" .. name .. "'", 4) end
      return
    end
    if C.tt_tensor_numel(src) ~= C.tt_tensor_numel(t) then
      error(string.format("load_state_dict: '%s' has %d elements, the model expects %d",
        name, tonumber(C.tt_tensor_numel(src)), tonumber(C.tt_tensor_numel(t))), 4)
    end
    if C.tt_copy_(t, src) ~= 0 then error(ffi.string(C.tt_last_error()), 4) end
    loaded = loaded + 1
  end)
  return loaded
end

-- -- Hooks ---------------------------------------------------------------------------

-- fn(module, output, inputs...) runs after every forward; a non-nil return replaces the
-- output. Returns a handle whose remove() unregisters the hook. Layers free their
-- intermediates as soon as they are consumed, so a hook that keeps an activation must
-- keep F.detach(output) (shares the storage) or a clone, never `output` itself.
function Module:register_forward_hook(fn)
  local hooks = rawget(self, "_hooks")
  if not hooks then
    hooks = {}
    rawset(self, "_hooks", hooks)
  end
  hooks[#hooks + 1] = fn
  local module = self
  return {
    remove = function()
      local hs = rawget(module, "_hooks")
      if not hs then return end
      for i = #hs, 1, -1 do
        if hs[i] == fn then table.remove(hs, i) end
      end
      if #hs == 0 then rawset(module, "_hooks", nil) end
    end,
  }
end

return Module
