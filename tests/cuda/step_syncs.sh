#!/usr/bin/env bash
# tests/cuda/step_syncs.sh TETRA — a training step on the GPU waits for the device once:
# the recipes' Llama (tiny) on cuda:0, tokens already on the device, runs forward (the
# embedding ids and cross-entropy targets checked on the device, deferred), the loss into
# AdamW's stats, backward, the gradient norm and clip coefficient on the device, the
# multi-tensor update, then the one read of the stats. tt_cuda_host_sync_count (every
# host wait of the engine) must grow by exactly 1 per step after a warm-up step, the loss
# must fall, and a bad token id must be reported by that read.
# Exit 77 (skip) without a GPU or a CUDA build.
set -euo pipefail
TETRA=${1:?usage: step_syncs.sh /path/to/tetra}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

source "$(dirname "$0")/need_gpus.bash"
need_gpus "$TETRA" 1 tt_cuda_host_sync_count

cd "$ROOT"
"$TETRA" -e '
  local tetra = require("tetra")
  local tffi = require("tetra.ffi")
  tffi.cdef_header("tetra_cuda.h")
  local C, Tn = tffi.C, require("tetra.tensor")
  local train, optim = tetra.train, tetra.optim
  local tiny = dofile("recipes/tiny.lua")
  local cfg = require("tetra.config").build({ defaults = tiny.defaults, world_size = false })
  local dev = train.device("cuda")
  local model = tiny.Model(cfg.model)
  train.to_device(model, dev)
  local opt = optim.AdamW(model:named_parameters(), { lr = 3e-3 })
  local B, T, V = 4, cfg.model.seq_len, cfg.model.vocab_size
  local host = tetra.zeros({ B, T + 1 }, { dtype = "i32" })
  for i = 0, B * (T + 1) - 1 do C.tt_tensor_set(host, i, (i * 7 + 3) % 13) end
  local tokens = Tn.take(C.tt_to_device(host, dev, Tn.pout))

  local function step()
    tffi.check(C.tt_cuda_set_deferred_checks(1))
    local loss = train.loss(model, tokens)
    tffi.check(C.tt_step_stats_set_loss(opt:stats(), loss))
    loss:backward()
    loss:free()
    tffi.check(C.tt_cuda_set_deferred_checks(0))
    opt:clip_grad_norm_async(1.0)
    opt:step()
    model:zero_grad()
    C.tt_tape_clear()
    return opt:read_stats()
  end

  local first = step()   -- warm-up: the allocator cache grows here
  local waits, last = {}, nil
  for s = 1, 5 do
    local before = C.tt_cuda_host_sync_count()
    last = step()
    waits[s] = tonumber(C.tt_cuda_host_sync_count() - before)
    print(string.format("step %d: loss %.4f  grad norm %.4f  host waits %d", s + 1, last.loss,
                        last.grad_norm, waits[s]))
  end
  local bad = false
  for s, w in ipairs(waits) do
    if w ~= 1 then print(string.format("FAIL: step %d waited for the device %d times, want 1", s + 1, w)); bad = true end
  end
  if not (last.loss < first.loss - 0.1) then
    print(string.format("FAIL: the loss did not fall (%.4f -> %.4f)", first.loss, last.loss)); bad = true
  end
  C.tt_tensor_set(host, 5, V + 3)
  local poisoned = Tn.take(C.tt_to_device(host, dev, Tn.pout))
  tokens = poisoned
  local ok, err = pcall(step)
  if ok or not tostring(err):find("embedding: id " .. (V + 3) .. " at position 5 is outside the vocabulary", 1, true) then
    print("FAIL: a bad id was not reported by the step read: " .. tostring(err)); bad = true
  end
  if bad then os.exit(1) end
  print("PASS: one host wait per step")'

# The same through tetra.train's loop (train.setup, env.step): the batch uploaded through
# pinned staging buffers, the micro-batch losses summed on the device, the mean loss put
# in the optimizer's stats, the clip and the update launched, then the one read; the
# phase times come from events. Two micro-batches per step, bf16 (fused GEMMs), on the
# README's bytes: tiny.lua's mock tokens are uniform, so their loss cannot fall (the first
# H200 run: 5.562, 5.552, 5.567, 5.559).
"$TETRA" -e '
  local tetra = require("tetra")
  local tffi = require("tetra.ffi")
  tffi.cdef_header("tetra_cuda.h")
  local C = tffi.C
  local tiny = dofile("recipes/tiny.lua")
  local cfg = require("tetra.config").build({ defaults = tiny.defaults, world_size = false,
    sets = { "train.device=cuda", "train.precision=bf16", "train.gradient_accumulation_steps=2",
             "data.mock=false", "data.input_path=README.md" } })
  cfg.log.progress = false
  local env = tiny.setup(cfg)
  local first = env.step()
  local bad, last = false, nil
  for s = 1, 4 do
    local before = C.tt_cuda_host_sync_count()
    last = env.step()
    local w = tonumber(C.tt_cuda_host_sync_count() - before)
    print(string.format("train step %d: loss %.4f  forward %.2f ms  optimizer %.2f ms  host waits %d",
                        s + 1, last.loss, last.forward_s * 1e3, last.optimizer_s * 1e3, w))
    if w ~= 1 then print("FAIL: a tetra.train step waited for the device " .. w .. " times, want 1"); bad = true end
    if not (last.forward_s > 0 and last.optimizer_s > 0) then print("FAIL: no phase times"); bad = true end
  end
  if not (last.loss < first.loss) then print("FAIL: the loss did not fall"); bad = true end
  if bad then os.exit(1) end
  print("PASS: tetra.train: one host wait per step")'

# train.cuda_graphs: two eager steps, then the step captured once (forward, backward, the
# AdamW update; memory from a private pool) and replayed, the batch copied into the static
# input and the learning rate written into the stats before each replay. The curve must be
# the eager one (same kernels, same order: equal up to float rounding of nothing, so the
# tolerance is tight), each replayed step must wait for the device once, and the learning
# rate must change under the replays (warm-up, then cosine). In fp16 the loss scale grows
# every clean step until the grads overflow, so replays skip updates and back it off; with
# a spike check (window 2, z 2) the device skips the spikes' updates against the limit. In
# fp8 the replays move the amax histories and scales on the device as eager steps do.
"$TETRA" -e '
  local tetra = require("tetra")
  local tffi = require("tetra.ffi")
  tffi.cdef_header("tetra_cuda.h")
  local C = tffi.C
  local tiny = dofile("recipes/tiny.lua")
  local bad = false
  for _, case in ipairs({ "fp32", "bf16", "fp16", "fp8", "spike" }) do
    local precision = case == "spike" and "fp32" or case
    local function run(graphs)
      local sets = { "train.device=cuda", "train.precision=" .. precision, "train.warmup_steps=4",
                     "train.gradient_accumulation_steps=2", "train.cuda_graphs=" .. tostring(graphs) }
      if precision == "fp16" then
        sets[#sets + 1] = "train.loss_scale_init=1048576"
        sets[#sets + 1] = "train.loss_scale_growth_interval=1"
      end
      if case == "spike" then
        for _, s in ipairs({ "train.spike_zscore=2", "train.spike_window=2", "train.max_bad_steps=100" }) do
          sets[#sets + 1] = s
        end
      end
      local cfg = require("tetra.config").build({ defaults = tiny.defaults, world_size = false,
        sets = sets })
      cfg.log.progress = false
      local env = tiny.setup(cfg)
      local out = {}
      for s = 1, 8 do
        local before = C.tt_cuda_host_sync_count()
        local r = env.step()
        r.waits = tonumber(C.tt_cuda_host_sync_count() - before)
        out[s] = r
      end
      return out, env
    end
    local eager = run(false)
    local graphed, env = run(true)
    for s = 1, 8 do
      local a, b = eager[s], graphed[s]
      local dl = math.abs(a.loss - b.loss) / math.abs(a.loss)
      local dg = a.skipped and 0 or math.abs(a.grad_norm - b.grad_norm) / math.abs(a.grad_norm)
      print(string.format("%s step %d: loss %.6f / %.6f (graph)  grad norm %.6f / %.6f  lr %.2e  scale %g%s  graph %.3f ms  host waits %d",
                          case, s, a.loss, b.loss, a.grad_norm, b.grad_norm, b.lr,
                          b.loss_scale, b.skipped and (" skipped " .. tostring(b.guard)) or "",
                          (b.graph_s or 0) * 1e3, b.waits))
      if dl > 1e-5 or dg > 1e-4 or a.skipped ~= b.skipped or a.loss_scale ~= b.loss_scale or
         a.guard ~= b.guard then
        print("FAIL: the replayed curve left the eager one"); bad = true
      end
      if s > 2 and not (b.graph_s and b.graph_s > 0) then print("FAIL: no graph time"); bad = true end
      if s > 3 and b.waits ~= 1 then print("FAIL: a replayed step waited " .. b.waits .. " times, want 1"); bad = true end
    end
    if env.graphs.graph.replays ~= 6 then print("FAIL: " .. env.graphs.graph.replays .. " replays, want 6"); bad = true end
  end
  if bad then os.exit(1) end
  print("PASS: train.cuda_graphs replays the eager curve with one host wait per step")'
