-- tetra.nn.recompute: activation recompute (activation checkpointing), the memory of a
-- transformer's blocks traded for a second forward.
--
--   recompute.checkpoint(block [, selective])   -- block's forward keeps only its input
--                                                   -- (selective: and its GEMM outputs)
--   recompute.apply(model, plan, cfg.train)   -- train.recompute over the plan's blocks
--
-- Selective (train.recompute=selective) keeps, besides the block's input, the outputs of
-- its GEMMs (q, k, v, the attention's output projection, the MLP's w1, w3, w2: every
-- tt_matmul / tt_linear family product, engine/ops/matmul.c, and the CUDA bf16 / fp16
-- GEMMs of engine/cuda/matmul_lowp.cu) from the first run; the
-- re-run takes them back instead of multiplying again and recomputes the rest: the
-- norms, RoPE, attention's core (scores, softmax, the product with V), SwiGLU / GELU,
-- the residual adds and the tensor- and sequence-parallel collectives. The GEMMs are
-- most of a block's FLOPs and their outputs a minority of its activations, so it keeps
-- most of full recompute's saving for a fraction of its time (docs/parallelism.md).
-- The kept outputs are bit for bit what the re-run would compute (the same kernel on the
-- same inputs), so the loss and gradients stay those of no recompute.
--
-- A checkpointed block runs its forward with recording off, so none of its activations
-- (norm outputs, q/k/v, attention, the MLP's hidden units) outlive the call, and records
-- one autograd node from its input x to its output y (tt_checkpoint, engine/core/autograd.c).
-- That node's backward re-runs the same forward from a leaf sharing x's storage, with
-- recording on, and backpropagates y's gradient through it (a nested backward that walks
-- only what the re-run recorded); the leaf's gradient then joins x's. The re-run calls
-- the same kernels on the same inputs in the same order, and the nested backward runs the
-- block's nodes in the order the plain backward would, so the loss and every gradient are
-- bit for bit those of the run without recompute. The cost: one more forward of every
-- checkpointed block per step, its collectives (tensor, sequence and context
-- parallelism) included; the gain: a block's activations live only while its own
-- backward runs. docs/parallelism.md has the measured trade.
--
-- What the re-run must not repeat: state a forward changes. Tetra's blocks have no
-- dropout (no RNG draws) and the loss guard reads only the loss and the gradient norm.
-- FP8 layers do change state in forward: each quantises x and W with the scales of its
-- amax histories, then records their amaxes there. The first run stashes the scales it
-- used (tt_checkpoint_begin .. tt_checkpoint, kept on the node) and the re-run quantises
-- with them and records nothing, so the histories move once and the codes are the
-- first run's (engine/ops/fp8.c); the output gradient's amax is recorded by the one
-- backward, as without recompute. On CUDA the scales live on the device: the stash keeps
-- the device tensor of the scales the first run used (engine/cuda/fp8_linear.cu), with
-- no host read.
-- The weights' bf16 / fp16 copies (tetra.optim.amp) are cast once per step and read
-- again by the re-run unchanged. Under CUDA graphs the re-run is part of the captured
-- backward like any kernel launch.
--
-- The hook is one LuaJIT FFI callback, called from inside tt_backward. LuaJIT's FFI
-- manual does not allow a callback from a C function that JIT-compiled code called (the
-- 2.1 build here copes, blacklisting the trace, but that is not promised), so every Lua
-- function that calls tt_backward / tt_backward_with has JIT compilation turned off
-- (tetra.nn.functional's backward and backward_with, the tensor method): the call is
-- always the interpreter's.
local ffi = require("ffi")
local C = require("tetra.ffi").C
local T = require("tetra.tensor")
local F = require("tetra.nn.functional")

local M = {}

-- Blocks run without recording, waiting for their backward: key -> { run, args }.
local pending, next_key = {}, 0

-- The block's extra arguments, tensors held by a reference of their own: the caller
-- frees its positions once the forward is done, long before the re-run reads them.
local function keep_args(...)
  local args = { n = select("#", ...), ... }
  for i = 1, args.n do
    local a = args[i]
    if T.is_tensor(a) then
      C.tt_tensor_retain(a)
      args[i] = ffi.gc(ffi.cast("tt_tensor *", a), C.tt_tensor_release)
    end
  end
  return args
end

local function drop_args(args)
  for i = 1, args.n do
    if T.is_tensor(args[i]) then F.free(args[i]) end
  end
end

local function rerun(key, leaf, grad_out)
  local k = tonumber(key)
  local p = pending[k]
  pending[k] = nil
  if not p then return C.tt_fail("recompute: no block is waiting under key " .. k) end
  local ok, err = pcall(function()
    local y = p.run(p.module, leaf, unpack(p.args, 1, p.args.n))
    C.tt_checkpoint_rerun_done()   -- the backward's products are not kept outputs
    F.backward_with(y, grad_out)
    F.free(y)
  end)
  drop_args(p.args)
  if not ok then return C.tt_fail("recompute: " .. tostring(err)) end
  return 0
end

local hook   -- the callback, made once and kept for the life of the process

local function install()
  if hook then return end
  hook = ffi.cast("tt_recompute_fn", function(key, leaf, grad_out, _)
    return rerun(key, leaf, grad_out)
  end)
  C.tt_set_recompute_hook(hook, nil)
end

-- Makes block's forward (whatever it is now: its class's, or one a plan installed) run
-- checkpointed whenever recording is on and its input x requires grad; otherwise (an
-- evaluation, generation, a frozen input) it runs as before. Extra arguments
-- (positions) are kept for the re-run. A block already checkpointed stays as it is.
function M.checkpoint(block, selective)
  install()
  if rawget(block, "_checkpointed") then return block end
  rawset(block, "_checkpointed", true)
  local keep = selective and 1 or 0
  local run = block.forward
  rawset(block, "forward", function(self, x, ...)
    if C.tt_is_grad_enabled() == 0 or x._requires_grad == 0 then return run(self, x, ...) end
    -- An empty tape holds no checkpoint node: whatever waits is from a forward whose
    -- tape was dropped without a backward (an error, a skipped evaluation).
    if C.tt_tape_size() == 0 then pending = {} end
    C.tt_set_grad_enabled(0)
    C.tt_checkpoint_begin()
    C.tt_checkpoint_keep_gemms(keep)
    local ok, y = pcall(run, self, x, ...)
    C.tt_set_grad_enabled(1)
    if not ok then
      C.tt_checkpoint_cancel()
      error(y, 0)
    end
    next_key = next_key + 1
    pending[next_key] = { run = run, module = self, args = keep_args(...) }
    if C.tt_checkpoint(x, y, next_key) ~= 0 then error(ffi.string(C.tt_last_error()), 2) end
    return y
  end)
  return block
end

-- Applies cfg.train.recompute (t) to model's blocks, the list the plan's pipeline entry
-- names (plan.pipeline.blocks: Llama's "layers", GPT-2's "h"): "full" checkpoints the
-- block of every index i (in the whole model, 0 first) with i % recompute_every == 0,
-- so 1 checkpoints all of them, 2 every other one starting with the first. Under
-- pipeline parallelism a stage holds some of the blocks under their whole-model
-- indices, so every layout checkpoints the same blocks. Returns how many this rank
-- checkpointed.
function M.apply(model, plan, t)
  local mode = t.recompute or "none"
  if mode == "none" then return 0 end
  if mode ~= "full" and mode ~= "selective" then
    error("train.recompute: '" .. tostring(mode) .. "' is not a mode (none, selective or full)", 2)
  end
  local path = plan and plan.pipeline and plan.pipeline.blocks
  local blocks = path and model:get(path)
  if not blocks then
    error("train.recompute=" .. mode .. ": the model's plan names no blocks list " ..
          "(plan.pipeline.blocks, as recipes/llama/plan.lua's)", 2)
  end
  local every, n = t.recompute_every or 1, 0
  for j, name in ipairs(blocks._child_names) do
    local idx = tonumber(name) or (j - 1)
    if idx % every == 0 then
      M.checkpoint(blocks[name], mode == "selective")
      n = n + 1
    end
  end
  return n
end

return M
