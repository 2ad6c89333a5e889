-- Activation recompute (train.recompute, tetra.nn.recompute): every step's loss and
-- gradient norm and the weights after the steps are bit for bit those of the run without
-- recompute (Llama and GPT-2; fp32, bf16, fp16, fp8; every block or every other one; with
-- gradient accumulation); the loss guard skips the same steps; a CUDA-graph step (CPU
-- check mode) equals the eager one; the step's peak memory drops; the blocks'
-- activations are not on the tape; a loop of backward calls re-runs on every one; bad
-- values and a plan without blocks are refused with one line.
local tetra = require("tetra")
local F = tetra.nn.functional
local C = require("tetra.ffi").C
local config = require("tetra.config")
local recompute = require("tetra.nn.recompute")

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")
local gpt2 = dofile(here .. "/../../recipes/gpt2.lua")

local GPT2_SMALL = { "model.vocab_size=256", "model.dim=64", "model.n_layers=3",
                     "model.n_heads=4", "model.ffn_hidden=128", "model.seq_len=32",
                     "train.batch_size=4" }

local same = assert(loadfile(here .. "/same_steps.lua"))(expect)
local build, flat, run = same.build, same.flat, same.run

-- Runs with recompute=none and with `mode_sets` on top of `sets`: every step's loss and
-- grad norm equal, every weight equal. Returns both runs' records.
local function expect_identical(recipe, sets, mode_sets, steps)
  local a, b = same.expect_identical(recipe, sets, mode_sets, steps)
  return a, b
end

describe("train.recompute=full", function()
  it("is bit-identical to no recompute (Llama, fp32), with a lower step peak", function()
    local a, b = expect_identical(tiny, { "model.n_layers=4" }, { "train.recompute=full" }, 4)
    -- Only the blocks' inputs stay between forward and backward: the step peak falls by
    -- a third and more on this model (2.78 MB -> 1.83 MB with 2 layers).
    expect(b[4].step_peak_bytes < 0.75 * a[4].step_peak_bytes).to_be(true)
  end)

  it("is bit-identical every other block, with accumulation, under bf16 and fp16", function()
    expect_identical(tiny, { "model.n_layers=3", "train.gradient_accumulation_steps=2" },
                     { "train.recompute=full", "train.recompute_every=2" }, 3)
    expect_identical(tiny, { "train.precision=bf16" }, { "train.recompute=full" }, 3)
    expect_identical(tiny, { "train.precision=fp16" }, { "train.recompute=full" }, 3)
  end)

  it("is bit-identical under fp8: the re-run reuses the first run's scales", function()
    -- Every forward moves the amax histories, so a re-run that read them again would
    -- quantise with the scales of the next micro-batch and record its amaxes twice.
    expect_identical(tiny, { "train.precision=fp8", "train.gradient_accumulation_steps=2" },
                     { "train.recompute=full" }, 3)
  end)

  it("is bit-identical on GPT-2 (LayerNorm, GELU, biases, tied head)", function()
    expect_identical(gpt2, GPT2_SMALL, { "train.recompute=full" }, 3)
  end)

  it("leaves the loss guard's verdicts as they are (spikes skipped on the same steps)",
     function()
    local sets = { "train.gradient_accumulation_steps=2", "train.max_grad_norm=0.05",
                   "train.warmup_steps=3", "train.steps=9", "train.spike_zscore=2.0",
                   "train.spike_window=2", "train.max_bad_steps=100" }
    local a, b = expect_identical(tiny, sets, { "train.recompute=full" }, 9)
    local skips = {}
    for i = 1, 9 do
      expect(b[i].skipped).to_be(a[i].skipped)
      expect(b[i].guard).to_be(a[i].guard)
      if a[i].skipped then skips[#skips + 1] = i end
    end
    expect(#skips > 0).to_be(true)   -- the guard did judge some step bad
  end)

  it("replays a captured step as eager steps without recompute run (CUDA graphs, CPU check)",
     function()
    local sets = { "train.gradient_accumulation_steps=2", "train.precision=bf16",
                   "train.warmup_steps=2", "train.steps=6" }
    local eager = tiny.setup(build(tiny, sets))
    local with = { "train.recompute=full" }
    for _, s in ipairs(sets) do with[#with + 1] = s end
    local graphed = tiny.setup(build(tiny, with), { graph_check = true })
    for _ = 1, 6 do
      local a, b = eager.step(), graphed.step()
      expect(b.loss).to_be(a.loss)
      expect(b.grad_norm).to_be(a.grad_norm)
    end
    expect(graphed.graphs.graph.replays).to_be(4)
  end)

  it("keeps none of a checkpointed block's activations on the tape", function()
    local cfg = build(tiny, { "train.recompute=full", "train.recompute_every=2",
                              "model.n_layers=2" })
    local model = tiny.Model(cfg.model)
    expect(recompute.apply(model, tiny.plan, cfg.train)).to_be(1)   -- block 0 of 0, 1
    local ids = F.arange_i64(8):view({ 1, 8 })
    C.tt_tape_clear()
    local logits = model(ids)
    local with = F.tape_ops()
    F.free(logits)
    C.tt_tape_clear()
    recompute.apply(model, tiny.plan, { recompute = "full" })   -- block 1 too
    logits = model(ids)
    local all = F.tape_ops()
    F.free(logits)
    C.tt_tape_clear()
    -- Block 0 is one checkpoint node; block 1 records its ops as usual until it is
    -- checkpointed too: then only the embedding, the final norm and the head remain.
    expect(with.checkpoint).to_be(1)
    expect(all.checkpoint).to_be(2)
    local function total(t) local n = 0 for _, c in pairs(t) do n = n + c end return n end
    expect(total(with) > total(all) + 5).to_be(true)
    expect(total(all)).to_be(2 + 3)   -- checkpoint x2, embedding, norm, head
  end)

  it("re-runs on every one of many backward calls", function()
    local cfg = build(tiny, { "train.recompute=full", "model.n_layers=1", "model.dim=16",
                              "model.ffn_hidden=32", "model.n_heads=2", "model.n_kv_heads=2" })
    local model = tiny.Model(cfg.model)
    recompute.apply(model, tiny.plan, cfg.train)
    local ids = F.arange_i64(4):view({ 1, 4 })
    local w = model.layers[1].feed_forward.w2.weight
    local first
    for i = 1, 300 do
      local logits = model(ids)
      local loss = tetra.sum(logits)
      F.free(logits)
      F.backward(loss)
      F.free(loss)
      if i == 1 then first = flat(w.grad) end
    end
    -- 300 identical backward passes accumulate 300 times the first one's gradient.
    local g = flat(w.grad)
    expect(g[1]).to_be_near(300 * first[1], math.abs(first[1]) * 1e-3 + 1e-9)
  end)
end)

describe("train.recompute=selective", function()
  it("is bit-identical to no recompute (Llama, fp32), its step peak between none and full",
     function()
    local a, b = expect_identical(tiny, { "model.n_layers=4" }, { "train.recompute=selective" }, 4)
    local c = run(tiny, { "model.n_layers=4", "train.recompute=full" }, 4)
    -- The GEMM outputs stay; the norms', attention's and the MLP activation's go.
    expect(b[4].step_peak_bytes < 0.9 * a[4].step_peak_bytes).to_be(true)
    expect(b[4].step_peak_bytes > 1.1 * c[4].step_peak_bytes).to_be(true)
  end)

  it("keeps an FP8 layer's bf16 output, not the f32 product inside it (fp8, Llama)", function()
    -- The CPU emulation's FP8 layer computes its product in f32 through tt_matmul and
    -- rounds it to bf16 after; selective recompute keeps what leaves the layer, as on the
    -- GPU. Measured with 4 layers: none 4.29 MB, selective 2.59 MB (0.60 of none; keeping
    -- the f32 products instead, 3.90 MB, 0.91), full 2.05 MB.
    local a, b = expect_identical(tiny, { "model.n_layers=4", "train.precision=fp8" },
                                  { "train.recompute=selective" }, 2)
    expect(b[2].step_peak_bytes < 0.75 * a[2].step_peak_bytes).to_be(true)
  end)

  it("is bit-identical every other block, with accumulation, bf16, fp16, fp8 and GPT-2",
     function()
    expect_identical(tiny, { "model.n_layers=3", "train.gradient_accumulation_steps=2" },
                     { "train.recompute=selective", "train.recompute_every=2" }, 3)
    expect_identical(tiny, { "train.precision=bf16" }, { "train.recompute=selective" }, 3)
    expect_identical(tiny, { "train.precision=fp16" }, { "train.recompute=selective" }, 3)
    expect_identical(tiny, { "train.precision=fp8", "train.gradient_accumulation_steps=2" },
                     { "train.recompute=selective" }, 3)
    expect_identical(gpt2, GPT2_SMALL, { "train.recompute=selective" }, 3)
  end)
end)

describe("train.recompute config", function()
  local function refused(sets)
    local ok, err = pcall(build, tiny, sets)
    expect(ok).to_be(false)
    expect(config.is_error(err)).to_be(true)
    return err.message
  end

  it("refuses an unknown mode, naming the key and the modes", function()
    local msg = refused({ "train.recompute=maybe" })
    expect(msg).to_match("train%.recompute must be one of none, selective, full, got")
  end)

  it("refuses a model whose plan names no blocks", function()
    local model = tiny.Model(build(tiny, {}).model)
    expect(function() recompute.apply(model, nil, { recompute = "full" }) end)
      .to_error("train.recompute=full: the model's plan names no blocks list")
    expect(recompute.apply(model, nil, { recompute = "none" })).to_be(0)
  end)

  it("refuses recompute_every below 1", function()
    expect(refused({ "train.recompute_every=0" })).to_match("train%.recompute_every must be >= 1")
  end)

  it("takes fp8 with recompute on cuda (the device stashes the first run's scales)", function()
    for _, mode in ipairs({ "selective", "full" }) do
      local cfg = build(tiny, { "train.recompute=" .. mode, "train.precision=fp8",
                                "train.device=cuda" })
      expect(cfg.train.recompute).to_be(mode)
    end
  end)
end)
