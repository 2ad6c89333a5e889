-- tetra.parallel.context: context (sequence) parallelism over the mesh's cp group.
--
--   local cp = tetra.parallel.context
--   cp.chunk_positions(T, size, rank)     -- positions (0-based) of a rank's tokens
--   local ids, targets, pos = cp.slice(tokens, mesh.cp)
--                                         -- (B, T + 1) -> this rank's (B, T / cp) each
--                                         -- and their positions (T / cp) i64
--   cp.apply(attention_module, mesh.cp)   -- its attend gathers keys and values
--
-- The sequence of T tokens is cut into 2 cp chunks of T / (2 cp); rank r holds chunks r
-- and 2 cp - 1 - r. Under a causal mask the later chunk costs more work than the earlier
-- one, so pairing an early chunk with a late one gives every rank the same work.
-- The model runs on this rank's tokens with their true positions (RoPE rotates q and k
-- there; learned position embeddings look them up). An attention module of the plan's
-- `context` list all-gathers k and v over the group (sp_gather: backward reduce-scatters
-- dK and dV, so each rank receives the sum of every rank's gradient for its own keys) and
-- attends with the positions of the gathered keys: key j is visible to query i when
-- k_pos[j] <= q_pos[i], exactly the single-process causal mask. Everything outside
-- attention works per token and needs no communication. With bf16/f16 activations on CUDA
-- the op sees the chunks in those positions (runs of consecutive positions) and runs
-- cuDNN per (query chunk, key chunk) pair: fully visible, causal on the pair's diagonal,
-- or skipped, merged by log-sum-exp (kernels/cuda/attention.cu).
--
-- Loss and gradients: each rank's loss is the mean over its B x T / cp tokens; every
-- rank holds as many tokens, so the mean of those over the group is the mean over all
-- B x T tokens. Parameters are replicated over cp: tetra.parallel.data averages the
-- gradients over dp x cp (mesh.dpcp), which gives the gradient of that global mean.
local ffi = require("ffi")
local C = require("tetra.ffi").C
local F = require("tetra.nn.functional")
local tensor = require("tetra.tensor")

local free = F.free
local M = {}

-- A user error raised once (by rank 0) when every rank hits it alike.
local function fail(fmt, ...)
  require("tetra.dist").fail(string.format(fmt, ...))
end

-- The length of one chunk of a T-token sequence over `size` ranks.
function M.chunk_len(T, size)
  if T % (2 * size) ~= 0 then
    fail("context parallelism: model.seq_len (%d) must be divisible by 2 x " ..
         "parallel.context_parallel_size (%d)", T, 2 * size)
  end
  return T / (2 * size)
end

-- Positions (a Lua array, 0-based) of rank `rank`'s T / size tokens: chunk rank, then
-- chunk 2 size - 1 - rank.
function M.chunk_positions(T, size, rank)
  local L = M.chunk_len(T, size)
  local pos = {}
  for _, c in ipairs({ rank, 2 * size - 1 - rank }) do
    for i = 0, L - 1 do pos[#pos + 1] = c * L + i end
  end
  return pos
end

-- A (n) i64 tensor from a Lua array of positions.
local function index_tensor(list)
  local t = F.empty({ #list }, C.TT_I64)
  local p = ffi.cast("int64_t *", C.tt_tensor_data(t))
  for i, v in ipairs(list) do p[i - 1] = v end
  return t
end

local uploaded_positions = {}   -- M.slice's positions on a GPU, by length, layout, device

-- tokens: (B, T + 1) i32/i64 on any device -> ids (B, T / cp) and targets (B, T / cp) i64
-- on that device (the tokens at this rank's positions and the ones after them: two
-- contiguous chunks, copied as two strided blocks each, no host round trip) and those
-- positions as a (T / cp) i64 tensor there.
function M.slice(tokens, group)
  local B, T = tonumber(tokens._shape[0]), tonumber(tokens._shape[1]) - 1
  local L = M.chunk_len(T, group.size)
  local dev = tokens._device
  local ids, targets = F.empty({ B, 2 * L }, C.TT_I64, dev), F.empty({ B, 2 * L }, C.TT_I64, dev)
  for k, c in ipairs({ group.rank, 2 * group.size - 1 - group.rank }) do
    for shift, out in pairs({ [0] = ids, [1] = targets }) do
      local dst, src = F.narrow(out, 1, (k - 1) * L, L), F.narrow(tokens, 1, c * L + shift, L)
      local rc = C.tt_copy_(dst, src)
      free(dst)
      free(src)
      if rc ~= 0 then error(ffi.string(C.tt_last_error()), 2) end
    end
  end
  if dev == C.TT_CPU then
    return ids, targets, index_tensor(M.chunk_positions(T, group.size, group.rank))
  end
  -- On a GPU the positions are uploaded once per length, layout and device (an upload
  -- from pageable memory waits for the stream: once per micro-batch was a host wait in
  -- every step), then copied on the device: the caller owns (and frees) what it gets.
  local key = string.format("%d/%d/%d@%s", T, group.size, group.rank, tostring(dev))
  local up = uploaded_positions[key]
  if not up then
    up = tensor.moved(index_tensor(M.chunk_positions(T, group.size, group.rank)), dev)
    uploaded_positions[key] = up
  end
  local pos = F.empty({ 2 * L }, C.TT_I64, dev)
  local rc = C.tt_copy_(pos, up)
  if rc ~= 0 then error(ffi.string(C.tt_last_error()), 2) end
  return ids, targets, pos
end

-- -- Attention -------------------------------------------------------------------------

-- The positions of the keys gathered from every rank (rank order, each rank's two
-- chunks), for local sequences of n tokens, on `device`; cached in `cache`.
local function key_positions(cache, group, n, device)
  local key = n .. "@" .. tostring(device)
  local kp = cache[key]
  if not kp then
    local all = {}
    for r = 0, group.size - 1 do
      for _, p in ipairs(M.chunk_positions(n * group.size, group.size, r)) do
        all[#all + 1] = p
      end
    end
    kp = index_tensor(all)
    if device ~= C.TT_CPU then
      local d = tensor.take(C.tt_to_device(kp, device, tensor.pout))
      free(kp)
      kp = d
    end
    cache[key] = kp
  end
  return kp
end

-- Makes attention module m attend over the whole sequence from this rank's chunks:
-- q (B, n, H, Dh), k, v (B, n, Hkv, Dh) at `positions` (n, from M.slice) -> (B, n, H, Dh).
-- Without positions the input is a whole sequence on one rank (generation): plain
-- causal attention, no communication.
function M.apply(m, group)
  local plain, cache = m.attend, {}
  m.attend = function(self, q, k, v, positions)
    if positions == nil then return plain(self, q, k, v) end
    local n = tonumber(q._shape[1])
    local kg = group:sp_gather(k, 1)                     -- (B, n * cp, Hkv, Dh)
    local vg = group:sp_gather(v, 1)
    local o = tensor.take(C.tt_attention_ex(q, kg, vg, positions,
                                            key_positions(cache, group, n, q._device), 1, 0,
                                            tensor.pout))
    free(kg); free(vg)
    return o
  end
end

return M
