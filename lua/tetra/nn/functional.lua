-- tetra.nn.functional: the ops layers are made of, with the argument forms layers use
-- (shapes as Lua arrays, theta before positions), plus F.free for releasing
-- intermediates as soon as the next op has consumed them. Results are ordinary tetra
-- tensors (wrapped by tetra.tensor, so the GC nudging by live bytes applies).
local ffi = require("ffi")
local T = require("tetra.tensor")
local C = ffi.C

local F = {}

local pout = T.pout
local take = T.take

local shape_buf = ffi.new("int64_t[8]")
local function shape_of(dims)
  for i = 1, #dims do shape_buf[i - 1] = dims[i] end
  return shape_buf, #dims
end

-- Drops Lua's reference now instead of at a later GC cycle (the tape keeps what backward
-- needs). Safe on nil. The tensor must not be used afterwards.
function F.free(t)
  if t ~= nil then
    ffi.gc(t, nil)
    C.tt_tensor_release(t)
  end
end

-- -- Creation ------------------------------------------------------------------------

function F.randn(dims, std)
  local s, n = shape_of(dims)
  return take(C.tt_tensor_randn(s, n, 0.0, std or 1.0, pout), 3)
end

-- device: an engine device id (default the CPU).
function F.zeros(dims, dtype, device)
  local s, n = shape_of(dims)
  return take(C.tt_tensor_zeros(s, n, dtype or C.TT_F32, device or C.TT_CPU, pout), 3)
end

function F.full(dims, value, dtype)
  local s, n = shape_of(dims)
  return take(C.tt_tensor_full(s, n, dtype or C.TT_F32, C.TT_CPU, value, pout), 3)
end

-- device: an engine device id (default the CPU).
function F.empty(dims, dtype, device)
  local s, n = shape_of(dims)
  return take(C.tt_tensor_empty(s, n, dtype or C.TT_F32, device or C.TT_CPU, pout), 3)
end

-- 0, 1, ..., n-1 as an i64 tensor (positions for learned position embeddings).
function F.arange_i64(n)
  local t = F.empty({ n }, C.TT_I64)
  local p = ffi.cast("int64_t *", C.tt_tensor_data(t))
  for i = 0, n - 1 do p[i] = i end
  return t
end

-- Marks t as a trainable leaf and returns it.
function F.parameter(t)
  if C.tt_set_requires_grad(t, 1) ~= 0 then error(ffi.string(C.tt_last_error()), 2) end
  return t
end

-- -- Shapes --------------------------------------------------------------------------

function F.view(x, dims)
  local s, n = shape_of(dims)
  return take(C.tt_view(x, s, n, pout), 3)
end

-- As F.view, but a strided x gives a strided view where its strides allow (tt_reshape):
-- the heads of one block of a fused q/k/v result, without a copy.
function F.reshape(x, dims)
  local s, n = shape_of(dims)
  return take(C.tt_reshape(x, s, n, pout), 3)
end

function F.narrow(x, dim, start, length)
  return take(C.tt_narrow(x, dim, start, length, pout), 3)
end

function F.contiguous(x) return take(C.tt_contiguous(x, pout), 3) end

-- A tensor sharing x's storage, outside autograd (what hooks should keep).
function F.detach(x) return take(C.tt_detach(x, pout), 3) end

-- -- Ops -----------------------------------------------------------------------------

function F.add(a, b) return take(C.tt_add(a, b, pout), 3) end
function F.mul(a, b) return take(C.tt_mul(a, b, pout), 3) end
function F.scale(a, s) return take(C.tt_scale(a, s, pout), 3) end
function F.linear(x, w, b) return take(C.tt_linear(x, w, b, pout), 3) end
function F.embedding(w, ids) return take(C.tt_embedding(w, ids, pout), 3) end
-- A vocabulary-parallel share of the table (rows of ids [start, start + rows of w)):
-- zero rows for the other ranks' ids (tt_embedding_band); f32 rows.
function F.embedding_band(w, ids, start)
  return take(C.tt_embedding_band(w, ids, start, C.TT_F32, pout), 3)
end
function F.rmsnorm(x, w, eps) return take(C.tt_rmsnorm(x, w, eps, pout), 3) end
-- The pre-norm block's residual add and RMSNorm in one pass (tt_add_rms_norm):
-- h = x + residual (x itself when residual is nil), y = rmsnorm(h) * w; returns h, y.
-- y_dtype "bf16" writes y in bf16 for a bf16 GEMM (default: x's dtype).
local pair = ffi.new("tt_tensor *[2]")
local function take_pair(status)
  if status ~= 0 then T.raise(ffi.string(C.tt_last_error())) end
  local h, y = T.wrap(pair), T.wrap(pair + 1)
  pair[0], pair[1] = nil, nil
  return h, y
end
function F.add_rms_norm(x, residual, w, eps, y_dtype)
  local dt = y_dtype and T.dtype(y_dtype) or x._dtype
  return take_pair(C.tt_add_rms_norm(x, residual, w, eps or 1e-5, dt, pair, pair + 1))
end
-- The same with LayerNorm (tt_add_layer_norm): y = layernorm(h) * w + b (b may be nil).
function F.add_layer_norm(x, residual, w, b, eps, y_dtype)
  local dt = y_dtype and T.dtype(y_dtype) or x._dtype
  return take_pair(C.tt_add_layer_norm(x, residual, w, b, eps or 1e-5, dt, pair, pair + 1))
end
function F.layernorm(x, w, b, eps) return take(C.tt_layernorm(x, w, b, eps, pout), 3) end
function F.gelu(x) return take(C.tt_gelu(x, pout), 3) end
function F.swiglu(gate, up) return take(C.tt_swiglu(gate, up, pout), 3) end

-- x: (B, T, H, Dh); positions: (T) index tensor or nil for 0..T-1.
function F.rope(x, theta, positions, interleaved)
  return take(C.tt_rope(x, positions, theta, interleaved and 1 or 0, pout), 3)
end
-- The same rotating x's own memory (tt_rope_): x must be contiguous and nothing else may
-- need its old values (a projection's output viewed as heads); returns a tensor sharing it.
function F.rope_(x, theta, positions, interleaved)
  return take(C.tt_rope_(x, positions, theta, interleaved and 1 or 0, pout), 3)
end

-- Causal attention. q: (B, T, Hq, Dh), k, v: (B, T, Hkv, Dh) -> (B, T, Hq, Dh);
-- positions: (T) index tensor shared by queries and keys, or nil for 0..T-1.
function F.causal_attention(q, k, v, positions)
  if positions ~= nil then
    return take(C.tt_attention_ex(q, k, v, positions, positions, 1, 0, pout), 3)
  end
  return take(C.tt_attention(q, k, v, 1, 0, pout), 3)
end

-- tokens (b, T + 1) -> inputs (b, T) and targets (b, T), the tokens after them; both
-- contiguous.
function F.inputs_targets(tokens)
  local T = tonumber(tokens._shape[1]) - 1
  local a, b = F.narrow(tokens, 1, 0, T), F.narrow(tokens, 1, 1, T)
  local ids, targets = F.contiguous(a), F.contiguous(b)
  F.free(a); F.free(b)
  return ids, targets
end

-- logits: (..., V), targets: (...) -> scalar mean loss over targets ~= ignore_index.
function F.cross_entropy(logits, targets, ignore_index)
  return take(C.tt_cross_entropy(logits, targets, ignore_index or -100, pout), 3)
end

-- The value of a one-element tensor (a loss) as a Lua number (on a GPU: a wait for it).
function F.item(t)
  return C.tt_tensor_get(t, 0)
end

F.no_grad = T.no_grad

-- The ops the tape holds now, counted by name ({ ["tt_linear_lowp_group"] = 4, ... }):
-- what a forward recorded, for tests and debugging.
function F.tape_ops()
  local count = {}
  for i = 0, tonumber(C.tt_tape_size()) - 1 do
    local name = ffi.string(C.tt_tape_node_name(i))
    count[name] = (count[name] or 0) + 1
  end
  return count
end

-- Backward from a scalar loss: accumulates .grad of the leaves and frees the tape.
function F.backward(loss)
  if C.tt_backward(loss) ~= 0 then error(ffi.string(C.tt_last_error()), 2) end
end

-- Backward from root with the upstream gradient grad (root's shape).
function F.backward_with(root, grad)
  if C.tt_backward_with(root, grad) ~= 0 then error(ffi.string(C.tt_last_error()), 2) end
end

-- Backward may call back into Lua (activation recompute, tetra.nn.recompute), which
-- LuaJIT's FFI promises only for a C call the interpreter made: these two never compile.
jit.off(F.backward)
jit.off(F.backward_with)

return F
