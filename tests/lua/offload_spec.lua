-- Optimizer offload (parallel.offload_optimizer, AdamW:offload_state): the moments move to
-- host tensors and each update goes through host copies of the parameter and gradient
-- with a host copy of the step's stats; on the CPU every step's loss and gradient norm
-- and every weight and moment after the steps are bit for bit those without offload
-- (fp32, bf16 with its weight copies, fp16 with loss scaling and accumulation, GPT-2);
-- the records count the moments as host memory; under bf16 and fp16 the matrices' f32
-- masters are off the device through forward and backward (the allocator's step peak
-- lower by exactly them), a tied embedding's stays, a weight written between steps is
-- taken into its host master; the update run as the train loop runs it lands in the next
-- step's forward, bit for bit; a checkpoint written with offload resumes to the same
-- steps; sgd and CUDA graphs are refused with one line.
local config = require("tetra.config")
local checkpoint = require("tetra.checkpoint")

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")
local gpt2 = dofile(here .. "/../../recipes/gpt2.lua")

local GPT2_SMALL = { "model.vocab_size=256", "model.dim=64", "model.n_layers=2",
                     "model.n_heads=4", "model.ffn_hidden=128", "model.seq_len=32",
                     "train.batch_size=4" }

local same = assert(loadfile(here .. "/same_steps.lua"))(expect)
local build, run = same.build, same.run

-- Offload against the update on the device: records, weights and moments equal.
local function expect_identical(recipe, sets, steps)
  local a, b, env = same.expect_identical(recipe, sets, { "parallel.offload_optimizer=true" },
                                          steps, true)
  expect(env.optimizer.offloaded).to_be(true)
  for _, m in ipairs(env.optimizer.m) do expect(m.device).to_be("cpu") end
  return a, b, env
end

describe("parallel.offload_optimizer", function()
  it("is bit-identical to the update on the device (Llama, fp32), moments counted on the host",
     function()
    local a, b = expect_identical(tiny, { "model.n_layers=2" }, 4)
    expect(a[4].optimizer_bytes > 0).to_be(true)
    expect(b[4].optimizer_bytes).to_be(0)
    expect(b[4].host_optimizer_bytes).to_be(a[4].optimizer_bytes)
  end)

  it("is bit-identical under bf16 (the weights' bf16 copies), fp16 with accumulation, GPT-2",
     function()
    expect_identical(tiny, { "train.precision=bf16" }, 3)
    expect_identical(tiny, { "train.precision=fp16", "train.gradient_accumulation_steps=2" }, 3)
    expect_identical(gpt2, GPT2_SMALL, 3)
  end)

  it("keeps the f32 masters of the GEMM-only weights off the device through forward and " ..
     "backward under bf16 and fp16, whole between steps", function()
    local C = require("tetra.ffi").C
    local amp = require("tetra.optim.amp")
    for _, prec in ipairs({ "bf16", "fp16" }) do
      local a, b, env = expect_identical(tiny, { "train.precision=" .. prec }, 4)
      -- per block wq wk wv wo w1 w2 w3, and the untied head
      local weights = amp.gemm_only_weights(env.model)
      expect(#weights).to_be(2 * 7 + 1)
      local bytes = 0
      for _, w in ipairs(weights) do bytes = bytes + 4 * w:numel() end
      expect(b[4].host_master_bytes).to_be(bytes)
      -- the allocator's step peak (CPU: the device is the host) drops by exactly them
      expect(a[4].step_peak_bytes - b[4].step_peak_bytes).to_be(bytes)
      local away = {}
      env.on_grads = function(_, n)
        away[n] = 0
        for _, w in ipairs(weights) do
          if C.tt_tensor_resident(w) == 0 then away[n] = away[n] + 1 end
        end
      end
      env.step()
      expect(away[5]).to_be(#weights)
      for _, w in ipairs(weights) do expect(C.tt_tensor_resident(w)).to_be(1) end
    end
  end)

  it("keeps a tied embedding's master on the device (the lookup reads it in f32)", function()
    local _, _, env = expect_identical(tiny, { "train.precision=bf16",
                                              "model.tie_embeddings=true" }, 3)
    local amp = require("tetra.optim.amp")
    local tied = env.model.tok_embeddings.weight
    for _, w in ipairs(amp.gemm_only_weights(env.model)) do
      expect(w == tied).to_be(false)
    end
    expect(#amp.gemm_only_weights(env.model)).to_be(2 * 7)
  end)

  it("takes a weight written between steps into its host master (a load, the REPL)",
     function()
    local C = require("tetra.ffi").C
    local function edited(extra)
      local sets = { "train.precision=bf16" }
      for _, s in ipairs(extra) do sets[#sets + 1] = s end
      local env = tiny.setup(build(tiny, sets))
      local out = {}
      for i = 1, 5 do
        out[i] = env.step()
        if i == 3 then   -- between steps, as a checkpoint load or a REPL line writes
          for name, w in env.model:iter_parameters() do
            if name == "layers.0.attention.wq.weight" then
              assert(C.tt_axpy_(w, -0.5, w) == 0)
            end
          end
        end
      end
      return out
    end
    local a = edited({})
    local b = edited({ "parallel.offload_optimizer=true" })
    for i = 1, 5 do
      expect(b[i].loss).to_be(a[i].loss)
      expect(b[i].grad_norm).to_be(a[i].grad_norm)
    end
  end)

  it("lands an update in the next step's forward, block by block, bit for bit", function()
    -- as tetra.train.loop runs it: each step but the last says the next one follows
    local C = require("tetra.ffi").C
    local amp = require("tetra.optim.amp")
    local function steps(sets, n)
      local env = tiny.setup(build(tiny, sets))
      local out, in_flight = {}, {}
      -- the masters kept away through backward also when they landed in the forward
      local weights = amp.gemm_only_weights(env.model)
      env.on_grads = function(_, i)
        local away = 0
        for _, w in ipairs(weights) do away = away + (C.tt_tensor_resident(w) == 0 and 1 or 0) end
        in_flight.away = in_flight.away or {}
        in_flight.away[i] = away
      end
      for i = 1, n do
        env.overlap_next = i < n
        out[i] = env.step()
        in_flight[i] = env.optimizer.update_in_flight and env.optimizer:update_in_flight()
      end
      local state = {}
      for name, p in env.model:iter_parameters() do state[name] = same.flat(p) end
      return out, state, in_flight
    end
    for _, prec in ipairs({ "fp32", "bf16", "fp16" }) do
      local base = { "train.precision=" .. prec, "train.gradient_accumulation_steps=2" }
      local off = { "parallel.offload_optimizer=true" }
      for _, x in ipairs(base) do off[#off + 1] = x end
      local a, sa = steps(base, 5)
      local b, sb, in_flight = steps(off, 5)
      for i = 1, 5 do
        expect(b[i].loss).to_be(a[i].loss)
        expect(b[i].grad_norm).to_be(a[i].grad_norm)
      end
      expect(in_flight[1]).to_be(true)    -- still landing when the step returned
      expect(in_flight[4]).to_be(true)
      expect(in_flight[5]).to_be(false)   -- the last step lands its update itself
      local want = prec == "fp32" and 0 or 2 * 7 + 1
      for i = 2, 5 do expect(in_flight.away[i]).to_be(want) end
      for name, w in pairs(sa) do expect(sb[name]).to_equal(w) end
    end
  end)

  it("resumes from its checkpoint to the same steps", function()
    local dir = os.tmpname()
    os.remove(dir)
    local sets = { "parallel.offload_optimizer=true", "checkpoint.dir=" .. dir, "train.steps=6" }
    local whole = run(tiny, sets, 6)
    local first = tiny.setup(build(tiny, sets))
    for _ = 1, 3 do first.step() end
    checkpoint.save(first)
    local resumed = { "checkpoint.resume=true" }
    for _, s in ipairs(sets) do resumed[#resumed + 1] = s end
    local env = tiny.setup(build(tiny, resumed))
    expect(env.step_count).to_be(3)
    expect(env.optimizer.offloaded).to_be(true)
    for i = 4, 6 do
      local r = env.step()
      expect(r.loss).to_be(whole[i].loss)
      expect(r.grad_norm).to_be(whole[i].grad_norm)
    end
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("refuses sgd and CUDA graphs with one line", function()
    local function refused(sets)
      local ok, err = pcall(build, tiny, sets)
      expect(ok).to_be(false)
      expect(config.is_error(err)).to_be(true)
      return err.message
    end
    expect(refused({ "parallel.offload_optimizer=true", "optim.name=sgd" }))
      .to_match("optim%.name=sgd has none")
    expect(refused({ "parallel.offload_optimizer=true", "train.cuda_graphs=true",
                     "train.device=cuda" }))
      .to_match("a CUDA graph cannot capture")
  end)
end)
