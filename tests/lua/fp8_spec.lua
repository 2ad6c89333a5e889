-- FP8 training (train.precision=fp8, CPU emulation of the cuBLASLt FP8 GEMMs):
--   the amax histories and scales across steps follow the delayed-scaling rule;
--   train.fp8_layers picks the layers (default: every Linear but the head);
--   evaluation and generation (forwards with recording off) quantise at the current
--   scales and record nothing: the steps after them are those of a run without them;
--   a checkpoint carries the amax histories and scales: a resumed run continues bit for
--   bit (and without them it would not: the first resumed step would rescale);
--   a tiny Llama trained in FP8 follows the bf16 run within a measured tolerance.
local ffi = require("ffi")
local tetra = require("tetra")
local checkpoint = require("tetra.checkpoint")
local json = require("tetra.util.json")
local config = require("tetra.config")

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")

local function tiny_cfg(sets)
  local cfg = config.build({ defaults = tiny.defaults, sets = sets or {}, world_size = false })
  cfg.log.progress = false
  return cfg
end

local function run(env, n)
  local out = {}
  for i = 1, n do
    local r = env.step()
    out[i] = { r.loss, r.grad_norm }
  end
  return out
end

-- Every meta of every FP8 layer as a flat list of numbers (scale, pos, filled, history).
local function snapshot(env)
  local out, paths = {}, {}
  for path in pairs(env.amp.fp8_states) do paths[#paths + 1] = path end
  table.sort(paths)
  for _, path in ipairs(paths) do
    local st = env.amp.fp8_states[path]
    for _, role in ipairs({ "x", "w", "g" }) do
      local m = st[role]
      out[#out + 1] = tonumber(m.scale)
      out[#out + 1] = m.pos
      out[#out + 1] = m.filled
      out[#out + 1] = m.quantised   -- past the history's length: 5 steps, a history of 4
      for i = 0, m.history_len - 1 do out[#out + 1] = tonumber(m.amax_history[i]) end
    end
  end
  return out
end

local function rm_rf(path) os.execute("rm -rf '" .. path .. "'") end

describe("fp8 delayed scaling across steps", function()
  it("each scale is fp8_max / (the max of the last history_len amaxes), in float", function()
    local env = tiny.setup(tiny_cfg({ "train.precision=fp8", "train.fp8_history=3",
                                      "train.fp8_margin=1" }))
    local st = env.amp.fp8_states["layers.0.feed_forward.w1"]
    local seen = { x = {}, g = {} }
    for step = 1, 5 do
      env.step()
      for _, role in ipairs({ "x", "g" }) do
        local m = st[role]
        -- The newest amax sits just before pos in the ring.
        seen[role][step] = tonumber(m.amax_history[(m.pos - 1) % m.history_len])
        local h = 0
        for i = math.max(1, step - 2), step do h = math.max(h, seen[role][i]) end
        local fmax = role == "x" and 448 or 57344
        -- A quotient of floats computed in double and rounded to float is the float
        -- quotient; the margin of 1 halves it exactly.
        local want = tonumber(ffi.new("float", fmax / h)) / 2
        expect(tonumber(m.scale)).to_be(want)
        expect(m.filled).to_be(math.min(step, 3))
      end
    end
    -- The amaxes moved (a constant history would make the check above weak).
    expect(seen.x[1] ~= seen.x[5]).to_be(true)
    expect(seen.g[1] ~= seen.g[5]).to_be(true)
  end)
end)

describe("train.fp8_layers", function()
  it("defaults to every Linear but the head", function()
    local env = tiny.setup(tiny_cfg({ "train.precision=fp8" }))
    expect(env.amp.layers).to_be(2 * 7)
    expect(env.amp.fp8_states["output"]).to_be(nil)
    expect(env.amp.fp8_states["layers.1.attention.wo"] ~= nil).to_be(true)
  end)

  it("globs pick exactly the layers they match, the head included if named", function()
    local env = tiny.setup(tiny_cfg({ "train.precision=fp8",
                                      "train.fp8_layers=layers.*.feed_forward.*,output" }))
    local names = {}
    for path in pairs(env.amp.fp8_states) do names[#names + 1] = path end
    table.sort(names)
    expect(names).to_equal({ "layers.0.feed_forward.w1", "layers.0.feed_forward.w2",
                             "layers.0.feed_forward.w3", "layers.1.feed_forward.w1",
                             "layers.1.feed_forward.w2", "layers.1.feed_forward.w3",
                             "output" })
    -- Every norm writes bf16 under FP8, as under bf16 (attention then runs in bf16).
    local norms = 0
    for _, nm in ipairs(env.model:named_modules()) do
      if nm[2].add_forward then
        norms = norms + 1
        expect({ nm[1], nm[2].y_dtype }).to_equal({ nm[1], "bf16" })
      end
    end
    expect(norms > 0).to_be(true)
    -- The others run f32 GEMMs, widening the bf16 activations the norms now write.
    local wq = env.model.layers[1].attention.wq
    local y = wq(tetra.randn(4, 64):cast("bf16"))
    expect(y.dtype).to_be("f32")
    local r = env.step()
    expect(r.loss == r.loss).to_be(true)
    expect(env.amp.fp8_states["output"].x.filled).to_be(1)
  end)

  it("a glob that matches no Linear is an error naming the key", function()
    expect(function()
      tiny.setup(tiny_cfg({ "train.precision=fp8", "train.fp8_layers=layers.*.mlp.*" }))
    end).to_error("train.fp8_layers: 'layers.*.mlp.*' matches no Linear layer")
  end)

  it("refuses a value that is neither \"all\" nor globs", function()
    expect(function()
      tiny_cfg({ "train.precision=fp8", "train.fp8_layers=" })
    end).to_error("train.fp8_layers must be")
  end)

  it("is refused without train.precision=fp8 (it would do nothing)", function()
    expect(function()
      tiny_cfg({ "train.precision=bf16", "train.fp8_layers=layers.*" })
    end).to_error("train.fp8_layers applies to train.precision=fp8 (this run is bf16)")
  end)
end)

describe("train.fp8_fast_accum", function()
  it("is refused on the CPU, whose emulation sums in fp32", function()
    expect(function()
      tiny_cfg({ "train.precision=fp8", "train.fp8_fast_accum=true" })
    end).to_error("train.fp8_fast_accum is an option of cuBLASLt's FP8 GEMMs on CUDA")
  end)

  it("is refused without train.precision=fp8", function()
    expect(function()
      tiny_cfg({ "train.precision=bf16", "train.fp8_fast_accum=true" })
    end).to_error("train.fp8_fast_accum applies to train.precision=fp8 (this run is bf16)")
  end)

  it("reaches the layers' scaling state when accepted", function()
    local amp = require("tetra.optim.amp")
    local nn = require("tetra.nn")
    local m = nn.Linear(16, 16)
    local ctx = amp.wrap(m, { train = { precision = "fp8", fp8_fast_accum = true } })
    expect(ctx.fp8_states[""] and ctx.fp8_states[""].fast_accum).to_be(1)
  end)
end)

describe("train.precision=fp8 on cuda", function()
  local function refused(sets)
    local all = { "train.precision=fp8", "train.device=cuda" }
    for _, v in ipairs(sets) do all[#all + 1] = v end
    local ok, err = pcall(tiny_cfg, all)
    expect(ok).to_be(false)
    expect(config.is_error(err)).to_be(true)
    return err.message
  end

  it("refuses rows and features the FP8 GEMMs cannot take, naming them", function()
    expect((pcall(tiny_cfg, { "train.precision=fp8", "train.device=cuda" }))).to_be(true)
    expect(refused({ "model.seq_len=20", "train.batch_size=2" })).to_match(
      "each layer gets 40 %(a micro%-batch of 2 sequences x model%.seq_len 20 / context " ..
      "parallel 1%)")
    expect(refused({ "model.seq_len=20", "train.gradient_accumulation_steps=4" }))
      .to_match("each layer gets 40 %(a micro%-batch of 2 sequences")
    expect(refused({ "model.seq_len=48", "train.batch_size=1",
                     "parallel.context_parallel_size=2" }))
      .to_match("each layer gets 24 .* / context parallel 2%)")
    expect(refused({ "model.ffn_hidden=40" })).to_match(
      "layers%.0%.feed_forward%.w1 has 64 in and 40 out on each of 1 tensor%-parallel rank")
    expect(refused({ "model.ffn_hidden=96", "parallel.tensor_parallel_size=4" })).to_match(
      "layers%.0%.feed_forward%.w1 has 64 in and 24 out on each of 4 tensor%-parallel rank")
    -- accepted: 48 features per rank under tp 2, the layer left out of FP8, the CPU
    for _, sets in ipairs({
        { "train.precision=fp8", "train.device=cuda", "model.ffn_hidden=96",
          "parallel.tensor_parallel_size=2" },
        { "train.precision=fp8", "train.device=cuda", "model.ffn_hidden=40",
          "train.fp8_layers=layers.*.attention.*" },
        { "train.precision=fp8", "model.seq_len=20", "train.batch_size=2",
          "model.ffn_hidden=40" } }) do
      local ok, cfg = pcall(tiny_cfg, sets)
      expect(ok).to_be(true)
      expect(cfg.train.precision).to_be("fp8")
    end
  end)
end)

describe("fp8 inference (evaluation, generation)", function()
  it("leaves training's scaling as it was: steps after it are those of a run without it",
     function()
    local sets = { "train.precision=fp8", "train.fp8_history=4" }
    local plain = run(tiny.setup(tiny_cfg(sets)), 6)
    local env = tiny.setup(tiny_cfg(sets))
    -- before the first step too: every history still empty, and it stays so
    local loss0 = env.evaluate(2)
    expect(loss0 > 0 and loss0 < 10).to_be(true)
    for _, st in pairs(env.amp.fp8_states) do
      expect(st.x.filled + st.w.filled + st.g.filled).to_be(0)
    end
    local first = run(env, 3)
    local before = snapshot(env)
    local loss = env.evaluate(2)
    local ids = env.generate({ 1, 2, 3 }, { max_new_tokens = 4, temperature = 0 })
    expect(#ids).to_be(4)
    expect(loss > 0 and loss < 10).to_be(true)
    expect(snapshot(env)).to_equal(before)
    local rest = run(env, 3)
    for i = 1, 3 do
      expect(first[i][1]).to_be(plain[i][1])
      expect(rest[i][1]).to_be(plain[3 + i][1])
      expect(rest[i][2]).to_be(plain[3 + i][2])
    end
  end)
end)

describe("fp8 checkpoints", function()
  it("carry the amax histories and scales: the resumed run is bit-identical", function()
    local dir = os.tmpname()
    os.remove(dir)
    local base = { "train.precision=fp8", "train.fp8_history=4", "train.steps=10",
                   "checkpoint.dir=" .. dir }
    local full = run(tiny.setup(tiny_cfg(base)), 10)

    local first = tiny.setup(tiny_cfg(base))
    run(first, 5)
    local saved = snapshot(first)
    checkpoint.save(first)
    local sets = { "checkpoint.resume=true" }
    for _, s in ipairs(base) do sets[#sets + 1] = s end
    local env = tiny.setup(tiny_cfg(sets))
    expect(env.step_count).to_be(5)
    expect(snapshot(env)).to_equal(saved)
    local rest = run(env, 5)
    for i = 1, 5 do
      expect(rest[i][1]).to_be(full[5 + i][1])
      expect(rest[i][2]).to_be(full[5 + i][2])
    end

    -- Without the scaling state (the file removed) the first resumed step scales from
    -- its own amaxes and the run leaves the uninterrupted one: the state matters.
    local ck = dir .. "/step_000005"
    os.remove(ck .. "/fp8_00000.json")
    local sums = json.decode(io.open(ck .. "/checksums.json"):read("*a"))
    sums["fp8_00000.json"] = nil
    local f = io.open(ck .. "/checksums.json", "w")
    f:write(json.encode(sums), "\n")
    f:close()
    local bare = run(tiny.setup(tiny_cfg(sets)), 1)
    expect(bare[1][2] ~= full[6][2]).to_be(true)
    rm_rf(dir)
  end)
end)

describe("fp8 against bf16 (a tiny Llama learning a byte corpus)", function()
  -- recipes/tiny.lua at lr 5e-3 on a repeated sentence (byte tokens through tetra.data's
  -- pipeline): the loss falls from 5.5 to about 1.95 in 20 steps. Measured (this build):
  -- the largest |loss_fp8 - loss_bf16| over the 20 steps 0.0159, the final gap 0.016; the
  -- grad norm differs by 3.2% on average (1.9% without step 4), 29.5% at most: at step 4
  -- the gradients jump (norm 2.8 -> 9.7) and the delayed e5m2 scale, set by the smaller
  -- amaxes before, saturates them (FP8 clips the spike: 6.87). Bounds: loss 3e-2, grad
  -- norm 5% on average and 40% at most.
  it("stays within 3e-2 of the bf16 loss and near its grad norm over 20 steps", function()
    local path = os.tmpname() .. ".txt"
    local f = assert(io.open(path, "w"))
    for i = 1, 200 do f:write("the quick brown fox jumps over the lazy dog ", i % 7, "\n") end
    f:close()
    local base = { "data.mock=false", "data.input_path=" .. path, "train.lr=5e-3",
                   "train.sample_tokens=0" }
    local function curve(precision)
      local sets = { "train.precision=" .. precision }
      for _, s in ipairs(base) do sets[#sets + 1] = s end
      return run(tiny.setup(tiny_cfg(sets)), 20)
    end
    local bf16, fp8 = curve("bf16"), curve("fp8")
    os.remove(path)
    local gap, ggap, gsum = 0, 0, 0
    for i = 1, 20 do
      gap = math.max(gap, math.abs(fp8[i][1] - bf16[i][1]))
      local rel = math.abs(fp8[i][2] - bf16[i][2]) / bf16[i][2]
      ggap, gsum = math.max(ggap, rel), gsum + rel
    end
    if os.getenv("TETRA_AMP_VERBOSE") then
      io.stderr:write(string.format("fp8 vs bf16: loss gap %.4f, grad norm gap max %.3f " ..
                                    "mean %.4f, final losses %.4f / %.4f\n", gap, ggap,
                                    gsum / 20, fp8[20][1], bf16[20][1]))
    end
    expect(bf16[1][1] - bf16[20][1] > 3).to_be(true)   -- it learns: the gap means something
    expect(gap > 0).to_be(true)
    expect(gap <= 3e-2).to_be(true)
    expect(gsum / 20 <= 0.05).to_be(true)
    expect(ggap <= 0.4).to_be(true)
  end)
end)
