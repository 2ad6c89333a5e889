-- tetra.tensor: the tt_tensor metatype and the functional ops.
--
-- A Lua tensor is a `tt_tensor &` cdata (a reference to the engine's struct) carrying a
-- finalizer that drops one engine reference. It passes to any C function that takes a
-- `tt_tensor *`, and, unlike a raw pointer, can be indexed with numbers (t[i]).
--
-- Index conventions: dims, starts and element positions are 0-based with negative dims
-- counting from the end, exactly as in the C API and PyTorch (t:size(0), t:sum(-1),
-- t:narrow(1, 0, 4), t[0]). Lua tables stay 1-based: t:shape()[1] is the first dim, and
-- t:tolist() gives ordinary Lua arrays.
--
-- Memory lives in C where Lua's collector cannot see it, so tensors can be freed early
-- with t:free() (never use t afterwards), and every few wraps the engine's live byte
-- count is read: when it has grown by more than M.gc_threshold bytes since the last
-- collection, a full collection runs.

local ffi = require("ffi")
local tffi = require("tetra.ffi")
local C = ffi.C

local M = {}
local methods = {}   -- t:name(...)
local getters = {}   -- t.name
local setters = {}   -- t.name = v

-- Out-parameter box shared by every wrapper: filled by the C call, emptied by take()
-- before anything else can run.
local pout = ffi.new("tt_tensor *[1]")
M.pout = pout

-- -- Memory and wrapping ------------------------------------------------------------

M.gc_threshold = 256 * 1024 * 1024
local stats = ffi.new("tt_alloc_stats")
local gc_baseline = 0
local wraps = 0

-- Device memory counts too when this binary has CUDA and a GPU (resolved once).
local has_cuda = nil
local function cuda_present()
  if has_cuda == nil then
    has_cuda = pcall(tffi.cdef_header, "tetra_cuda.h") and tffi.has_symbol("tt_cuda_device_count")
               and C.tt_cuda_device_count() > 0
  end
  return has_cuda
end

local function live_bytes()
  C.tt_alloc_stats_get(C.TT_CPU, stats)
  local live = tonumber(stats.live_bytes)
  if cuda_present() and C.tt_alloc_stats_get(C.tt_cuda_current_device(), stats) == 0 then
    live = live + tonumber(stats.live_bytes)
  end
  return live
end

local function nudge_gc()
  local live = live_bytes()
  if live > gc_baseline + M.gc_threshold then
    collectgarbage("collect")
    gc_baseline = live_bytes()
  elseif live < gc_baseline then
    gc_baseline = live
  end
end

-- Takes ownership of a tensor pointer the caller owns (refcount already counted for
-- us). NULL gives nil.
local function wrap(p)
  if p == nil then return nil end
  wraps = wraps + 1
  if wraps % 32 == 0 then nudge_gc() end
  return ffi.gc(p[0], C.tt_tensor_release)
end
M.wrap = wrap

-- Wraps a pointer we do not own (a field such as ->grad): takes a new reference.
local function borrow(p)
  if p == nil then return nil end
  C.tt_tensor_retain(p)
  return wrap(p)
end
M.borrow = borrow

-- The error level of the innermost caller outside the tetra library, so that a failing
-- op reports the user's line (tail calls make fixed levels unreliable).
local function user_level()
  local level = 3
  while true do
    local info = debug.getinfo(level, "S")
    if not info then return 1 end
    if info.what ~= "C" and not info.source:find("/lua/tetra/", 1, true) then return level - 1 end
    level = level + 1
  end
end

-- Raises msg at the user's line.
local function raise(msg)
  error(msg, user_level())
end
M.raise = raise

local function raise_engine_error()
  raise(ffi.string(C.tt_last_error()))
end

-- Checks `status` and wraps the tensor left in pout.
local function take(status)
  if status ~= 0 then raise_engine_error() end
  local p = pout[0]
  pout[0] = nil
  return wrap(p)
end
M.take = take

local function check(status)
  if status ~= 0 then raise_engine_error() end
end

function M.is_tensor(x)
  return type(x) == "cdata" and ffi.istype("tt_tensor", x)
end

-- -- Argument helpers ---------------------------------------------------------------

local dtype_alias = {
  float = "f32", float32 = "f32", fp32 = "f32", bfloat16 = "bf16", half = "f16",
  float16 = "f16", fp16 = "f16", int = "i32", int32 = "i32", long = "i64", int64 = "i64",
  e4m3 = "e4m3", e5m2 = "e5m2", fp8 = "e4m3",
}

function M.dtype(d)
  if d == nil then return C.TT_F32 end
  if type(d) == "number" then return d end
  local id = C.tt_dtype_from_name(dtype_alias[d] or d)
  if id < 0 then raise("unknown dtype '" .. tostring(d) .. "' (f32, bf16, f16, e4m3, e5m2, i32, i64)") end
  return id
end

function M.device(d)
  if d == nil or d == "cpu" then return C.TT_CPU end
  if type(d) == "number" then return d end
  if d == "cuda" then return 0 end
  local n = type(d) == "string" and d:match("^cuda:(%d+)$")
  if not n then raise("unknown device '" .. tostring(d) .. "' (cpu, cuda, cuda:N)") end
  return tonumber(n)
end

local function device_name(dev)
  return dev < 0 and "cpu" or ("cuda:" .. dev)
end

-- (2, 3, opts) or ({2, 3}, opts) -> int64_t[8], ndim, opts. opts may be a dtype name.
local shape_buf = ffi.new("int64_t[8]")
local function parse_shape(...)
  local first = ...
  local n, opts = 0, nil
  if type(first) == "table" then
    for i, v in ipairs(first) do shape_buf[i - 1] = v; n = i end
    opts = select(2, ...)
  else
    local args = select("#", ...)
    for i = 1, args do
      local v = select(i, ...)
      if type(v) ~= "number" then opts = v; break end
      shape_buf[i - 1] = v
      n = i
    end
  end
  if n > 8 then raise("at most 8 dims") end
  if type(opts) == "string" then opts = { dtype = opts } end
  return shape_buf, n, opts or {}
end

-- An int64_t[] from a Lua array (for C arguments).
function M.int64s(tbl)
  return ffi.new("int64_t[?]", math.max(#tbl, 1), tbl)
end

local dims_buf = ffi.new("int[8]")
-- nil -> all dims; a number or a table of numbers -> int[], n.
local function parse_dims(dims)
  if dims == nil then return nil, 0 end
  if type(dims) == "number" then dims_buf[0] = dims; return dims_buf, 1 end
  for i, d in ipairs(dims) do dims_buf[i - 1] = d end
  return dims_buf, #dims
end

local function finish(t, opts)
  if opts.requires_grad then check(C.tt_set_requires_grad(t, 1)) end
  return t
end

-- -- Creation ------------------------------------------------------------------------

function M.empty(...)
  local s, n, o = parse_shape(...)
  return finish(take(C.tt_tensor_empty(s, n, M.dtype(o.dtype), M.device(o.device), pout)), o)
end

function M.zeros(...)
  local s, n, o = parse_shape(...)
  return finish(take(C.tt_tensor_zeros(s, n, M.dtype(o.dtype), M.device(o.device), pout)), o)
end

function M.ones(...)
  local s, n, o = parse_shape(...)
  return finish(take(C.tt_tensor_full(s, n, M.dtype(o.dtype), M.device(o.device), 1, pout)), o)
end

-- tetra.full({2, 3}, 7.5, opts)
function M.full(shape, value, opts)
  local s, n, o = parse_shape(shape, opts)
  return finish(take(C.tt_tensor_full(s, n, M.dtype(o.dtype), M.device(o.device), value, pout)), o)
end

local function to_device(t, o)
  local dev = M.device(o.device)
  local dt = o.dtype and M.dtype(o.dtype)
  if dt and dt ~= t._dtype then t = take(C.tt_cast(t, dt, pout)) end
  if dev ~= C.TT_CPU then t = take(C.tt_to_device(t, dev, pout)) end
  return finish(t, o)
end

-- Normal(mean, std) f32; opts: mean, std, dtype, device, requires_grad.
function M.randn(...)
  local s, n, o = parse_shape(...)
  return to_device(take(C.tt_tensor_randn(s, n, o.mean or 0, o.std or 1, pout)), o)
end

-- Uniform [lo, hi) f32; opts: lo, hi, dtype, device, requires_grad.
function M.rand(...)
  local s, n, o = parse_shape(...)
  return to_device(take(C.tt_tensor_rand(s, n, o.lo or 0, o.hi or 1, pout)), o)
end

-- Integers in [lo, hi): tetra.randint(lo, hi, {shape}, opts); dtype default i64.
function M.randint(lo, hi, shape, opts)
  local s, n, o = parse_shape(shape, opts)
  local t = take(C.tt_tensor_randint(s, n, lo, hi, M.dtype(o.dtype or "i64"), pout))
  if o.device then t = take(C.tt_to_device(t, M.device(o.device), pout)) end
  return t
end

-- arange(stop) / arange(start, stop[, step][, opts]): i64 when every bound is an
-- integer, f32 otherwise (as torch.arange).
function M.arange(a, b, c, d)
  local start, stop, step, opts = 0, a, 1, nil
  if type(b) == "number" then
    start, stop = a, b
    if type(c) == "number" then step, opts = c, d else opts = c end
  else
    opts = b
  end
  if type(opts) == "string" then opts = { dtype = opts } end
  opts = opts or {}
  if step == 0 then raise("arange: step must not be 0") end
  local n = math.max(0, math.ceil((stop - start) / step))
  local integral = start % 1 == 0 and stop % 1 == 0 and step % 1 == 0
  local vals = ffi.new("double[?]", math.max(n, 1))
  for i = 0, n - 1 do vals[i] = start + i * step end
  shape_buf[0] = n
  local dt = M.dtype(opts.dtype or (integral and "i64" or "f32"))
  return to_device(take(C.tt_tensor_from_f64(vals, shape_buf, 1, dt, pout)),
                   { device = opts.device, requires_grad = opts.requires_grad })
end

-- from_table({{1, 2}, {3, 4}}[, opts]): the nesting gives the shape; f32 by default.
function M.from_table(tbl, opts)
  if type(opts) == "string" then opts = { dtype = opts } end
  opts = opts or {}
  local shape, node = {}, tbl
  while type(node) == "table" do
    shape[#shape + 1] = #node
    node = node[1]
  end
  if #shape > 8 then raise("from_table: at most 8 dims") end
  local numel = 1
  for _, s in ipairs(shape) do numel = numel * s end
  local vals = ffi.new("double[?]", math.max(numel, 1))
  local k = 0
  local function fill(x, d)
    if d > #shape then
      if type(x) ~= "number" then raise("from_table: expected a number, got " .. type(x)) end
      vals[k] = x
      k = k + 1
      return
    end
    if type(x) ~= "table" or #x ~= shape[d] then
      raise("from_table: ragged table (dim " .. (d - 1) .. " should have " .. shape[d] .. " entries)")
    end
    for i = 1, shape[d] do fill(x[i], d + 1) end
  end
  fill(tbl, 1)
  for i, s in ipairs(shape) do shape_buf[i - 1] = s end
  return to_device(take(C.tt_tensor_from_f64(vals, shape_buf, #shape, M.dtype(opts.dtype), pout)),
                   { device = opts.device, requires_grad = opts.requires_grad })
end

function M.manual_seed(seed) C.tt_manual_seed(seed) end
function M.rng_state() return C.tt_rng_state() end
function M.set_rng_state(s) C.tt_rng_set_state(s) end

-- Runs fn(...) with autograd recording off, restoring the previous mode even on error.
function M.no_grad(fn, ...)
  local prev = C.tt_is_grad_enabled()
  C.tt_set_grad_enabled(0)
  local res = { pcall(fn, ...) }
  C.tt_set_grad_enabled(prev)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

function M.is_grad_enabled() return C.tt_is_grad_enabled() ~= 0 end
function M.set_grad_enabled(on) C.tt_set_grad_enabled(on and 1 or 0) end

function M.memory_stats(device)
  local s = ffi.new("tt_alloc_stats")
  check(C.tt_alloc_stats_get(M.device(device), s))
  return { live_bytes = tonumber(s.live_bytes), peak_bytes = tonumber(s.peak_bytes),
           cached_bytes = tonumber(s.cached_bytes), num_allocs = tonumber(s.num_allocs),
           num_cache_hits = tonumber(s.num_cache_hits) }
end

-- -- Properties ----------------------------------------------------------------------

getters.dtype = function(t) return ffi.string(C.tt_dtype_name(t._dtype)) end
getters.device = function(t) return device_name(t._device) end
getters.ndim = function(t) return t._ndim end
getters.requires_grad = function(t) return t._requires_grad ~= 0 end
getters.is_leaf = function(t) return t._is_leaf ~= 0 end
getters.grad = function(t) return borrow(t._grad) end

setters.grad = function(t, g)
  if g == nil then
    check(C.tt_zero_grad(t))
    return
  end
  C.tt_tensor_retain(g)
  local old = t._grad
  t._grad = g
  C.tt_tensor_release(old)
end
setters.requires_grad = function(t, on) check(C.tt_set_requires_grad(t, on and 1 or 0)) end

-- -- Shape and elements --------------------------------------------------------------

function methods.numel(t) return tonumber(C.tt_tensor_numel(t)) end

-- randn and rand tensors are drawn lazily (tetra.h): t drawn now (its memory taken);
-- returns t.
function methods.materialize(t)
  tffi.check(C.tt_tensor_materialize(t), 2)
  return t
end
function methods.dim(t) return t._ndim end

function methods.shape(t)
  local s = {}
  for i = 0, t._ndim - 1 do s[i + 1] = tonumber(t._shape[i]) end
  return s
end

local function norm_dim(t, d)
  local nd = t._ndim
  if d < 0 then d = d + nd end
  if d < 0 or d >= nd then
    raise(("dim %d out of range for a %d-dim tensor"):format(d, nd))
  end
  return d
end

function methods.size(t, d)
  if d == nil then return methods.shape(t) end
  return tonumber(t._shape[norm_dim(t, d)])
end

function methods.stride(t, d)
  if d == nil then
    local s = {}
    for i = 0, t._ndim - 1 do s[i + 1] = tonumber(t._stride[i]) end
    return s
  end
  return tonumber(t._stride[norm_dim(t, d)])
end

function methods.is_contiguous(t) return C.tt_tensor_is_contiguous(t) ~= 0 end

-- CPU copy when t lives on a device (for reading elements).
local function host_copy(t)
  if t._device == C.TT_CPU then return t end
  return take(C.tt_to_device(t, C.TT_CPU, pout))
end

function methods.item(t)
  if C.tt_tensor_numel(t) ~= 1 then
    raise("item(): tensor has " .. tonumber(C.tt_tensor_numel(t)) .. " elements, expected 1")
  end
  return C.tt_tensor_get(host_copy(t), 0)
end

-- Every element as float64, in logical row-major order (a double[numel] cdata).
function methods.to_f64(t)
  local h = host_copy(t)
  local n = tonumber(C.tt_tensor_numel(h))
  local buf = ffi.new("double[?]", math.max(n, 1))
  check(C.tt_tensor_to_f64(h, buf))
  return buf, n
end

function methods.tolist(t)
  local buf = methods.to_f64(t)
  local shape, k = methods.shape(t), 0
  if #shape == 0 then return buf[0] end
  local function build(d)
    local out = {}
    for i = 1, shape[d] do
      if d == #shape then
        out[i] = buf[k]
        k = k + 1
      else
        out[i] = build(d + 1)
      end
    end
    return out
  end
  return build(1)
end

function methods.data_ptr(t, ctype)
  local names = { [0] = "float *", "uint16_t *", "uint16_t *", "uint8_t *", "uint8_t *",
                  "int32_t *", "int64_t *" }
  return ffi.cast(ctype or names[t._dtype], C.tt_tensor_data(t))
end

-- -- Views ---------------------------------------------------------------------------

function methods.view(t, ...)
  local s, n = parse_shape(...)
  return take(C.tt_view(t, s, n, pout))
end
methods.reshape = methods.view

function methods.transpose(t, d0, d1)
  return take(C.tt_transpose(t, d0 or 0, d1 or 1, pout))
end

function methods.permute(t, ...)
  local dims = type(...) == "table" and ... or { ... }
  local buf = ffi.new("int[?]", math.max(#dims, 1), dims)
  return take(C.tt_permute(t, buf, #dims, pout))
end

function methods.narrow(t, dim, start, length)
  return take(C.tt_narrow(t, dim, start, length, pout))
end

-- t:select(dim, i): the slice at position i with `dim` removed (a view).
function methods.select(t, dim, i)
  dim = norm_dim(t, dim)
  local size = tonumber(t._shape[dim])
  if i < 0 then i = i + size end
  if i < 0 or i >= size then raise(("index %d out of range for size %d"):format(i, size)) end
  local sl = take(C.tt_narrow(t, dim, i, 1, pout))
  local s = methods.shape(sl)
  table.remove(s, dim + 1)
  for k, v in ipairs(s) do shape_buf[k - 1] = v end
  return take(C.tt_view(sl, shape_buf, #s, pout))
end

function methods.expand(t, ...)
  local s, n = parse_shape(...)
  return take(C.tt_expand(t, s, n, pout))
end

function methods.contiguous(t) return take(C.tt_contiguous(t, pout)) end
function methods.clone(t) return take(C.tt_clone(t, pout)) end
function methods.detach(t) return take(C.tt_detach(t, pout)) end

-- t:to("bf16") casts; t:to("cuda:0") / t:to("cpu") moves.
function methods.to(t, target)
  if type(target) == "string" and (target == "cpu" or target:match("^cuda")) then
    return take(C.tt_to_device(t, M.device(target), pout))
  end
  return take(C.tt_cast(t, M.dtype(target), pout))
end
function methods.cast(t, dtype) return take(C.tt_cast(t, M.dtype(dtype), pout)) end
function methods.float(t) return take(C.tt_cast(t, C.TT_F32, pout)) end
function methods.cpu(t) return take(C.tt_to_device(t, C.TT_CPU, pout)) end
function methods.cuda(t, n) return take(C.tt_to_device(t, n or 0, pout)) end

-- -- In place (no grad) --------------------------------------------------------------

function methods.copy_(t, src) check(C.tt_copy_(t, src)); return t end
function methods.fill_(t, v) check(C.tt_fill_(t, v)); return t end
function methods.zero_(t) check(C.tt_fill_(t, 0)); return t end
function methods.axpy_(t, alpha, b) check(C.tt_axpy_(t, alpha, b)); return t end

-- -- Autograd ------------------------------------------------------------------------

function methods.requires_grad_(t, on)
  check(C.tt_set_requires_grad(t, (on == nil or on) and 1 or 0))
  return t
end

function methods.backward(t, grad)
  if grad then check(C.tt_backward_with(t, grad)) else check(C.tt_backward(t)) end
end
jit.off(methods.backward)   -- may call back into Lua (tetra.nn.recompute)

function methods.zero_grad(t) check(C.tt_zero_grad(t)) end

-- Drops this reference now instead of at collection. t must not be used afterwards.
function methods.free(t)
  ffi.gc(t, nil)
  C.tt_tensor_release(t)
end

-- -- Arithmetic ----------------------------------------------------------------------

local function scalar_like(t, v)
  return take(C.tt_tensor_full(nil, 0, t._dtype, t._device, v, pout))
end

function M.add(a, b)
  if type(b) == "number" then return take(C.tt_add_scalar(a, b, pout)) end
  if type(a) == "number" then return take(C.tt_add_scalar(b, a, pout)) end
  return take(C.tt_add(a, b, pout))
end

function M.sub(a, b)
  if type(b) == "number" then return take(C.tt_add_scalar(a, -b, pout)) end
  if type(a) == "number" then
    local neg = take(C.tt_scale(b, -1, pout))
    return take(C.tt_add_scalar(neg, a, pout))
  end
  return take(C.tt_sub(a, b, pout))
end

function M.mul(a, b)
  if type(b) == "number" then return take(C.tt_scale(a, b, pout)) end
  if type(a) == "number" then return take(C.tt_scale(b, a, pout)) end
  return take(C.tt_mul(a, b, pout))
end

function M.div(a, b)
  if type(b) == "number" then return take(C.tt_scale(a, 1 / b, pout)) end
  if type(a) == "number" then return take(C.tt_div(scalar_like(b, a), b, pout)) end
  return take(C.tt_div(a, b, pout))
end

function M.scale(a, s) return take(C.tt_scale(a, s, pout)) end
function M.neg(a) return take(C.tt_scale(a, -1, pout)) end

methods.add, methods.sub, methods.mul, methods.div = M.add, M.sub, M.mul, M.div
methods.scale, methods.neg = M.scale, M.neg

-- -- Ops (engine/tetra_ops.h) --------------------------------------------------------

function M.silu(x) return take(C.tt_silu(x, pout)) end
function M.gelu(x) return take(C.tt_gelu(x, pout)) end
function M.swiglu(gate, up) return take(C.tt_swiglu(gate, up, pout)) end

-- sum(x[, dims][, keepdim]): dims nil = all, a number, or a table of dims.
function M.sum(x, dims, keepdim)
  local d, n = parse_dims(dims)
  return take(C.tt_sum(x, d, n, keepdim and 1 or 0, pout))
end
function M.mean(x, dims, keepdim)
  local d, n = parse_dims(dims)
  return take(C.tt_mean(x, d, n, keepdim and 1 or 0, pout))
end
function M.max(x, dims, keepdim)
  local d, n = parse_dims(dims)
  return take(C.tt_max(x, d, n, keepdim and 1 or 0, pout))
end
function M.softmax(x, dim) return take(C.tt_softmax(x, dim or -1, pout)) end

-- matmul(a, b[, bias][, trans_a][, trans_b]) (see tetra_ops.h for shapes).
function M.matmul(a, b, bias, trans_a, trans_b)
  return take(C.tt_matmul(a, b, bias, trans_a and 1 or 0, trans_b and 1 or 0, pout))
end
function M.linear(x, w, bias) return take(C.tt_linear(x, w, bias, pout)) end
function M.embedding(weight, ids) return take(C.tt_embedding(weight, ids, pout)) end
function M.rmsnorm(x, weight, eps) return take(C.tt_rmsnorm(x, weight, eps or 1e-5, pout)) end
function M.layernorm(x, weight, bias, eps)
  return take(C.tt_layernorm(x, weight, bias, eps or 1e-5, pout))
end
-- rope(x, positions, theta, interleaved): positions nil = 0..T-1.
function M.rope(x, positions, theta, interleaved)
  return take(C.tt_rope(x, positions, theta or 10000, interleaved and 1 or 0, pout))
end
-- attention(q, k, v[, causal = true][, scale = 1/sqrt(Dh)][, q_pos][, k_pos])
function M.attention(q, k, v, causal, scale, q_pos, k_pos)
  local c = (causal == nil or causal) and 1 or 0
  if q_pos or k_pos then
    return take(C.tt_attention_ex(q, k, v, q_pos, k_pos, c, scale or 0, pout))
  end
  return take(C.tt_attention(q, k, v, c, scale or 0, pout))
end
function M.cross_entropy(logits, targets, ignore_index)
  return take(C.tt_cross_entropy(logits, targets, ignore_index or -100, pout))
end

for _, name in ipairs({ "silu", "gelu", "swiglu", "sum", "mean", "max", "softmax", "matmul",
                        "linear", "rmsnorm", "layernorm", "rope", "attention",
                        "cross_entropy" }) do
  methods[name] = M[name]
end

-- t on engine device `dev`: t itself when it is there already; otherwise a copy there,
-- and t is released (the caller hands it over).
function M.moved(t, dev)
  if t._device == dev then return t end
  local d = take(C.tt_to_device(t, dev, pout))
  ffi.gc(t, nil)
  C.tt_tensor_release(t)
  return d
end

-- A string naming the tensor object itself (its address): the same for two references to
-- one tensor (a parameter shared by two modules), different for two tensors.
function M.key(t)
  return tostring(ffi.cast("uintptr_t", ffi.cast("void *", t)))
end

-- Parameter lists for the fused optimizer kernels: a Lua array of tensors -> tt_tensor*[].
function M.tensor_array(list)
  return ffi.new("tt_tensor *[?]", math.max(#list, 1), list)
end

function M.grad_norm(params)
  local out = ffi.new("double[1]")
  check(C.tt_grad_norm(M.tensor_array(params), #params, out))
  return out[0]
end

function M.clip_grad_norm(params, max_norm)
  local out = ffi.new("double[1]")
  check(C.tt_clip_grad_norm(M.tensor_array(params), #params, max_norm, out))
  return out[0]
end

-- L2 norm of all elements as a number, without recording (for inspection).
function methods.norm(t)
  return M.no_grad(function()
    local f = t._dtype == C.TT_F32 and t or take(C.tt_cast(t, C.TT_F32, pout))
    local sq = take(C.tt_mul(f, f, pout))
    local s = take(C.tt_sum(sq, nil, 0, 0, pout))
    return math.sqrt(C.tt_tensor_get(host_copy(s), 0))
  end)
end

-- -- Printing ------------------------------------------------------------------------

local EDGE = 3          -- elements shown at each end of an elided dim
local ELIDE_OVER = 1000 -- elide when the tensor has more elements than this

local function fmt_number(v, integral)
  if integral then return ("%d"):format(v) end
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  local a = math.abs(v)
  if a ~= 0 and (a >= 1e5 or a < 1e-4) then return ("%.4e"):format(v) end
  return ("%.4f"):format(v)
end

local function describe(t)
  local buf = ffi.new("char[128]")
  return ffi.string(C.tt_tensor_describe(t, buf, 128))
end

local function body(t)
  local h = host_copy(t)
  local shape = methods.shape(h)
  local numel = tonumber(C.tt_tensor_numel(h))
  local integral = C.tt_dtype_is_float(h._dtype) == 0
  if #shape == 0 then return fmt_number(C.tt_tensor_get(h, 0), integral) end
  if numel == 0 then return "[]" end
  local elide = numel > ELIDE_OVER
  local strides = {}
  local acc = 1
  for d = #shape, 1, -1 do strides[d] = acc; acc = acc * shape[d] end
  -- Two passes: the first finds the widest number so the columns line up.
  local width = 0
  local function cell(v)
    local str = fmt_number(v, integral)
    if #str > width then width = #str end
    return (" "):rep(width - #str) .. str
  end
  local function rows(d, base, indent)
    local n = shape[d]
    local idx = {}
    if elide and n > 2 * EDGE then
      for i = 0, EDGE - 1 do idx[#idx + 1] = i end
      idx[#idx + 1] = false
      for i = n - EDGE, n - 1 do idx[#idx + 1] = i end
    else
      for i = 0, n - 1 do idx[#idx + 1] = i end
    end
    local parts = {}
    for _, i in ipairs(idx) do
      if i == false then
        parts[#parts + 1] = "..."
      elseif d == #shape then
        parts[#parts + 1] = cell(C.tt_tensor_get(h, base + i))
      else
        parts[#parts + 1] = rows(d + 1, base + i * strides[d], indent .. " ")
      end
    end
    local sep = d == #shape and ", " or (",\n" .. indent .. " ")
    return "[" .. table.concat(parts, sep) .. "]"
  end
  rows(1, 0, "")
  return rows(1, 0, "")
end

local function tostring_tensor(t)
  local head = "tensor(" .. describe(t) .. (t._requires_grad ~= 0 and ", requires_grad" or "") .. ")"
  local ok, b = pcall(body, t)
  return head .. "\n" .. (ok and b or ("<" .. tostring(b) .. ">"))
end

-- -- The metatype --------------------------------------------------------------------

local mt = {
  __index = function(t, k)
    local m = methods[k]
    if m then return m end
    local g = getters[k]
    if g then return g(t) end
    if type(k) == "number" then
      if t._ndim == 1 then
        local n = tonumber(t._shape[0])
        local i = k < 0 and k + n or k
        if i < 0 or i >= n then raise(("index %d out of range for size %d"):format(k, n)) end
        return C.tt_tensor_get(host_copy(t), i)
      end
      return methods.select(t, 0, k)
    end
    return nil
  end,
  __newindex = function(t, k, v)
    local s = setters[k]
    if s then return s(t, v) end
    if type(k) == "number" and t._ndim == 1 then
      local n = tonumber(t._shape[0])
      local i = k < 0 and k + n or k
      if i < 0 or i >= n then raise(("index %d out of range for size %d"):format(k, n)) end
      check(C.tt_tensor_set(t, i, v))
      return
    end
    raise("cannot set field '" .. tostring(k) .. "' of a tensor")
  end,
  __add = M.add, __sub = M.sub, __mul = M.mul, __div = M.div,
  __unm = function(a) return take(C.tt_scale(a, -1, pout)) end,
  __len = function(t) return t._ndim > 0 and tonumber(t._shape[0]) or 1 end,
  __tostring = tostring_tensor,
}
ffi.metatype("tt_tensor", mt)

M.methods = methods
return M
