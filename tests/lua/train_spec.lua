-- tetra.optim, tetra.train, tetra.metrics, the byte tokenizer: optimizer steps against float64
-- formulas, schedules against their closed forms, gradient accumulation against one big
-- batch, the metrics contract, data determinism, generation, and a short real run whose
-- loss must fall.
local tetra = require("tetra")
local optim, train, metrics = tetra.optim, tetra.train, tetra.metrics
local tstep = require("tetra.train.step")

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")

local function tmpname(suffix)
  return os.tmpname() .. suffix
end

-- A config like `tetra run recipes/tiny.lua --set ...` would build.
local function tiny_cfg(over)
  local cfg = require("tetra.config").build({ defaults = tiny.defaults, sets = over or {},
                                              world_size = false })
  cfg.log.progress = false
  return cfg
end

describe("optim", function()
  it("AdamW matches the float64 update, decaying only 2-D weights", function()
    local w = tetra.from_table({ { 0.5, -1.0 }, { 2.0, 0.25 } }, { requires_grad = true })
    local b = tetra.from_table({ 0.1, -0.2 }, { requires_grad = true })
    local g_w, g_b = { 0.3, -0.1, 0.05, 0.7 }, { -0.4, 0.2 }
    local opt = optim.AdamW({ { "w", w }, { "b", b } },
                            { lr = 0.01, beta1 = 0.9, beta2 = 0.95, eps = 1e-8,
                              weight_decay = 0.1 })
    local ref = { w = { 0.5, -1.0, 2.0, 0.25 }, b = { 0.1, -0.2 } }
    local m, v = { w = { 0, 0, 0, 0 }, b = { 0, 0 } }, { w = { 0, 0, 0, 0 }, b = { 0, 0 } }
    for step = 1, 3 do
      w.grad = tetra.from_table({ { g_w[1], g_w[2] }, { g_w[3], g_w[4] } })
      b.grad = tetra.from_table(g_b)
      opt:step()
      for _, name in ipairs({ "w", "b" }) do
        local g, wd = name == "w" and g_w or g_b, name == "w" and 0.1 or 0.0
        for i = 1, #g do
          m[name][i] = 0.9 * m[name][i] + 0.1 * g[i]
          v[name][i] = 0.95 * v[name][i] + 0.05 * g[i] ^ 2
          local mhat, vhat = m[name][i] / (1 - 0.9 ^ step), v[name][i] / (1 - 0.95 ^ step)
          ref[name][i] = ref[name][i] * (1 - 0.01 * wd) - 0.01 * mhat / (math.sqrt(vhat) + 1e-8)
        end
      end
    end
    expect(w).to_be_close({ { ref.w[1], ref.w[2] }, { ref.w[3], ref.w[4] } }, 1e-6, 1e-7)
    expect(b).to_be_close(ref.b, 1e-6, 1e-7)
    expect(opt.step_count).to_be(3)
  end)

  it("SGD with momentum and weight decay matches the float64 update", function()
    local p = tetra.from_table({ 1.0, -2.0 }, { requires_grad = true })
    local opt = optim.SGD({ p }, { lr = 0.1, momentum = 0.9, weight_decay = 0.01 })
    local ref, buf = { 1.0, -2.0 }, { 0, 0 }
    for _ = 1, 3 do
      p.grad = tetra.from_table({ 0.5, 0.25 })
      opt:step()
      for i, g in ipairs({ 0.5, 0.25 }) do
        local d = g + 0.01 * ref[i]
        buf[i] = 0.9 * buf[i] + d
        ref[i] = ref[i] - 0.1 * buf[i]
      end
    end
    expect(p).to_be_close(ref, 1e-6, 1e-7)
  end)

  it("clips the global gradient norm", function()
    local a = tetra.zeros(2, { requires_grad = true })
    local b = tetra.zeros(1, { requires_grad = true })
    a.grad = tetra.from_table({ 3, 0 })
    b.grad = tetra.from_table({ 4 })
    local opt = optim.AdamW({ a, b }, { lr = 0.1, weight_decay = 0 })
    expect(opt:clip_grad_norm(1.0)).to_be_near(5, 1e-6)
    -- AdamW applies the coefficient in its update: the grads stay as they are
    expect(a.grad).to_be_close({ 3, 0 }, 0)
    expect(opt:read_stats().grad_scale).to_be_near(1 / (5 + 1e-6), 1e-7)
    opt:step()
    -- the same update as on the clipped grads (0.6, 0) and (0.8): Adam's first step moves
    -- every coordinate with a nonzero grad by lr against its sign
    expect(a).to_be_close({ -0.1, 0 }, 1e-6)
    expect(b).to_be_close({ -0.1 }, 1e-6)
    a.grad = tetra.from_table({ 0, 0 })
    b.grad = tetra.from_table({ 2 })
    expect(opt:clip_grad_norm(0)).to_be_near(2, 1e-6)
    expect(opt:read_stats().grad_scale).to_be(1)
  end)

  it("fp16 through AdamW's stats: unscaled, found_inf agreed on the device, one read", function()
    local cfg = require("tetra.config").build({ defaults = tiny.defaults, sets = {},
                                                world_size = false })
    local ctx = tetra.amp.wrap(tiny.Model(cfg.model), "fp16")
    local w = tetra.from_table({ 1, 2 })
    w:requires_grad_()
    local opt = optim.AdamW({ w }, { lr = 0.1, weight_decay = 0 })
    local reduced = {}
    local peer_overflowed = {   -- a 2-rank group whose peer found inf
      size = 2,
      all_gather = function(_, t) return t * 1.0 end,
      all_reduce = function(_, t, op)
        reduced[#reduced + 1] = op
        t:copy_(tetra.from_table({ 1 }))
        return t
      end,
    }
    local stepped = 0
    w.grad = tetra.from_table({ 3 * 65536, 4 * 65536 })   -- finite here
    local skipped, norm = tstep.update(ctx, opt.params, function() stepped = stepped + 1; opt:step() end,
                                   function() return opt:clip_grad_norm(0) end,
                                   peer_overflowed, opt)
    expect(skipped).to_be(true)
    expect(norm ~= norm).to_be(true)
    expect(reduced).to_equal({ "max" })
    expect(w.grad).to_be_close({ 3, 4 }, 0, 0)             -- unscaled by 65536
    expect(stepped).to_be(0)
    expect(ctx:scale()).to_be(32768)
    -- the next step starts from clean stats: no overflow, the update runs
    w.grad = tetra.from_table({ 3 * 32768, 4 * 32768 })
    skipped, norm = tstep.update(ctx, opt.params, function() stepped = stepped + 1; opt:step() end,
                             function() return opt:clip_grad_norm(0) end, nil, opt)
    expect(skipped).to_be(false)
    expect(norm).to_be_near(5, 1e-6)
    expect(stepped).to_be(1)
    expect(w).to_be_close({ 0.9, 1.9 }, 1e-6)
  end)

  it("folds the clip coefficient into AdamW as clipping the grads first would", function()
    local function run(fold)
      local w = tetra.from_table({ 0.5, -1.5, 2.0 })
      w:requires_grad_()
      local opt = optim.AdamW({ w }, { lr = 0.05, weight_decay = 0 })
      for step = 1, 3 do
        w.grad = tetra.from_table({ 3 * step, -4, 0.5 })
        if fold then
          opt:clip_grad_norm(1.0)
        else   -- the grads scaled in place by the same coefficient
          local g = w.grad
          local n = math.sqrt(9 * step * step + 16 + 0.25)
          w.grad = tetra.from_table({ 3 * step, -4, 0.5 }) * (1.0 / (n + 1e-6))
          g:free()
        end
        opt:step()
      end
      return w
    end
    expect(run(true)).to_be_close(run(false), 1e-6, 1e-7)
  end)

  it("skips the update on the device when the gradient norm is not finite", function()
    local w = tetra.from_table({ 1, 2 })
    w:requires_grad_()
    local opt = optim.AdamW({ w }, { lr = 0.1 })
    w.grad = tetra.from_table({ 0 / 0, 1 })
    opt:clip_grad_norm_async(1.0)
    opt:step()
    expect(w).to_be_close({ 1, 2 }, 0)
    local s = opt:read_stats()
    expect(s.found_inf).to_be(true)
    w.grad = tetra.from_table({ 1, 1 })
    opt:clip_grad_norm(1.0)
    expect(opt:read_stats().found_inf).to_be(false)
  end)

  it("schedules: linear warmup, then cosine / linear decay to min_lr, or constant", function()
    local cos = optim.schedule({ lr = 1.0, min_lr = 0.1, warmup_steps = 10, steps = 110 })
    expect(cos(1)).to_be_near(0.1, 1e-12)
    expect(cos(10)).to_be_near(1.0, 1e-12)
    expect(cos(60)).to_be_near(0.1 + 0.9 * 0.5, 1e-12)
    expect(cos(110)).to_be_near(0.1, 1e-12)
    expect(cos(500)).to_be_near(0.1, 1e-12)
    local lin = optim.schedule({ lr = 1.0, min_lr = 0.0, warmup_steps = 0, steps = 100,
                                 schedule = "linear" })
    expect(lin(25)).to_be_near(0.75, 1e-12)
    local const = optim.schedule({ lr = 0.5, warmup_steps = 4, steps = 100,
                                   schedule = "constant" })
    expect(const(2)).to_be_near(0.25, 1e-12)
    expect(const(99)).to_be_near(0.5, 1e-12)
    expect(function() optim.schedule({ lr = 1, schedule = "step" }) end).to_error("unknown schedule")
  end)

  it("schedules warmup-stable-decay: lr held, then the shape's decay over the last steps", function()
    local base = { lr = 1.0, min_lr = 0.1, warmup_steps = 10, steps = 110, schedule = "wsd",
                   decay_steps = 20 }
    local lin = optim.schedule(base)
    expect(lin(5)).to_be_near(0.5, 1e-12)          -- warmup
    expect(lin(10)).to_be_near(1.0, 1e-12)
    expect(lin(11)).to_be_near(1.0, 1e-12)         -- stable
    expect(lin(90)).to_be_near(1.0, 1e-12)
    expect(lin(91)).to_be_near(1.0 - 0.9 / 20, 1e-12)   -- the decay's first step: p = 1/20
    expect(lin(100)).to_be_near(0.55, 1e-12)       -- halfway
    expect(lin(110)).to_be_near(0.1, 1e-12)        -- min_lr at the last step
    expect(lin(200)).to_be_near(0.1, 1e-12)
    local function shaped(shape)
      local c = {}
      for k, v in pairs(base) do c[k] = v end
      c.decay_shape = shape
      return optim.schedule(c)
    end
    expect(shaped("linear")(100)).to_be_near(lin(100), 1e-12)
    expect(shaped("cosine")(95)).to_be_near(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.25)), 1e-12)
    expect(shaped("sqrt")(95)).to_be_near(0.1 + 0.9 * (1 - math.sqrt(0.25)), 1e-12)
    expect(shaped("sqrt")(90)).to_be_near(1.0, 1e-12)
    expect(shaped("sqrt")(110)).to_be_near(0.1, 1e-12)
    -- The stable part does not depend on the run's length: a longer run agrees up to its
    -- own decay.
    local longer = optim.schedule({ lr = 1.0, min_lr = 0.1, warmup_steps = 10, steps = 1000,
                                    schedule = "wsd", decay_steps = 20 })
    for step = 1, 90 do expect(longer(step)).to_be(lin(step)) end
    expect(function() optim.schedule({ lr = 1, steps = 10, schedule = "wsd" }) end).to_error("decay_steps")
    expect(function() shaped("constant") end).to_error("unknown decay_shape")
    expect(function() optim.schedule({ lr = 1, steps = 10, schedule = "sqrt" }) end).to_error("unknown schedule")
  end)
end)

describe("data", function()
  it("mock batches depend only on (seed, step, split)", function()
    local d = train.mock_data(100, 3)
    local a, b = d:batch(5, 2, 8), d:batch(5, 2, 8)
    expect(a).to_have_shape({ 2, 9 })
    expect(a:tolist()).to_equal(b:tolist())
    expect(d:batch(6, 2, 8):tolist()).never.to_equal(a:tolist())
    expect(d:batch(5, 2, 8, "val"):tolist()).never.to_equal(a:tolist())
    for _, row in ipairs(a:tolist()) do
      for _, t in ipairs(row) do expect(t >= 0 and t < 100).to_be(true) end
    end
  end)

  it("the byte tokenizer: an id per byte, as it is, EOS the newline", function()
    local tok = tetra.data.tokenizer("byte")
    local text = "Hello, Tetra! \226\156\147 \255"   -- ill-formed UTF-8 kept as one byte
    local ids = tok:encode(text)
    expect(#ids).to_be(#text)
    for i = 1, #text do expect(ids[i]).to_be(text:byte(i)) end
    expect(tok:decode(ids)).to_be(text)
    expect(tok:vocab_size()).to_be(256)
    expect(tok:eos_id()).to_be(10)
    expect(tok:decode({ 104, 300, 105 })).to_be("h\239\191\189i")   -- no byte: U+FFFD
  end)

  -- data.tokenizer: byte (the default) through tetra.data's pipeline: JSONL has its text
  -- field read, a glob names several files, each document ends with EOS (a newline).
  local function byte_corpus()
    local dir = tmpname("_bytes")
    assert(os.execute("mkdir -p '" .. dir .. "'"))
    local docs = {}
    for k = 1, 2 do
      local f = assert(io.open(dir .. "/part-" .. k .. ".jsonl", "w"))
      for i = 1, 60 do
        local text = string.format("doc %d.%d: the quick brown fox", k, i)
        docs[#docs + 1] = text
        f:write('{"id": ', i, ', "text": "', text, '"}\n')
      end
      f:close()
    end
    return dir, docs
  end

  it("byte mode reads JSONL through the pipeline: the text field, no braces, a glob", function()
    local dir, docs = byte_corpus()
    local cfg = tiny_cfg({ "data.mock=false", "data.input_path=" .. dir .. "/*.jsonl",
                           "data.shuffle_buffer_size=0", "data.num_streams=1" })
    local src, tok = train.data_source(cfg)
    expect(src.local_rows).to_be(true)   -- tetra.data's source, not a reader of its own
    local B, T = cfg.train.batch_size, cfg.model.seq_len
    local stream = {}
    for step = 1, 10 do   -- past the end of the first file
      for _, row in ipairs(src:batch(step, B, T):tolist()) do
        for j = 1, T do stream[#stream + 1] = row[j] end   -- row[T + 1] starts the next row
      end
    end
    local text = tok:decode(stream)
    expect(text:find("[{}\"]")).to_be_nil()
    -- both files, in order, each document a line
    local want = table.concat(docs, "\n") .. "\n"
    expect(want:sub(1, #text)).to_be(text)
    expect(text:find("doc 2.1: the quick brown fox\ndoc 2.2:", 1, true)).never.to_be_nil()
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("byte mode resumes exactly from the source's state", function()
    local dir = byte_corpus()
    local sets = { "data.mock=false", "data.input_path=" .. dir .. "/*.jsonl" }
    local cfg = tiny_cfg(sets)
    local B, T = cfg.train.batch_size, cfg.model.seq_len
    local a = train.data_source(cfg)
    local want, state = {}, nil
    for step = 1, 5 do
      want[step] = a:batch(step, B, T):tolist()
      if step == 2 then state = a:state() end
    end
    local b = train.data_source(tiny_cfg(sets))
    b:load_state(state)
    for step = 3, 5 do expect(b:batch(step, B, T):tolist()).to_equal(want[step]) end
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("refuses a binary or non-UTF-8 training file in one line, before any model", function()
    local bin = tmpname(".bin")
    local f = assert(io.open(bin, "wb")); f:write("ELF\0\1\2 not text"); f:close()
    local latin = tmpname(".txt")
    f = assert(io.open(latin, "wb")); f:write(string.rep("caf\233 au lait\n", 10)); f:close()
    local function err_of(sets)
      local ok, e = pcall(train.data_source, tiny_cfg(sets))
      expect(ok).to_be(false)
      expect(type(e) == "table" and e.user).to_be(true)   -- printed alone, no traceback
      return e.message
    end
    -- The files are checked when the source opens, with the byte tokenizer or a BPE one.
    local bytes = { "data.mock=false", "data.input_path=" .. bin }
    expect(err_of(bytes)).to_match("^data: .*" .. bin:gsub("%p", "%%%0") ..
                                   ": not text %(a NUL byte at offset 3%)")
    local dir = tmpname(".d")
    os.execute("mkdir -p '" .. dir .. "'")
    local text = dir .. "/text.txt"
    f = assert(io.open(text, "w"))
    for i = 1, 50 do f:write("the cat sat on the mat ", i, "\n") end
    f:close()
    tetra.data.train_tokenizer({ text }, 280, dir)
    local bpe = { "data.mock=false", "data.tokenizer=" .. dir .. "/tokenizer.json",
                  "model.vocab_size=280" }
    bpe[4] = "data.input_path=" .. bin
    expect(err_of(bpe)).to_match("not text %(a NUL byte at offset 3%)")
    bpe[4] = "data.input_path=" .. latin
    expect(err_of(bpe)).to_match("not UTF%-8 text %(an ill%-formed byte at offset 3%)")
    bpe[4] = "data.input_path=" .. text
    local src = train.data_source(tiny_cfg(bpe))
    expect(src:batch(1, 8, 32)).to_have_shape({ 8, 33 })
    -- The guide's data.vocab_file: a tokenizer.json, or a vocab.json with merges.txt
    -- beside it; the same batches as data.tokenizer.
    local want = train.data_source(tiny_cfg(bpe)):batch(1, 8, 32):tolist()
    for _, vocab in ipairs({ "tokenizer.json", "vocab.json" }) do
      local v = { "data.mock=false", "model.vocab_size=280", "data.input_path=" .. text,
                  "data.vocab_file=" .. dir .. "/" .. vocab }
      expect(train.data_source(tiny_cfg(v)):batch(1, 8, 32):tolist()).to_equal(want)
    end
    -- data.online_tokenization=false: prepared token shards, or how to make them.
    local C = require("tetra.ffi").C
    local files = require("ffi").new("const char *[1]", { text })
    require("tetra.ffi").check(C.tt_data_prepare(files, 1, dir .. "/tokenizer.json", nil,
                                                 dir .. "/shards", 100000, 1, 0))
    local offline = { "data.mock=false", "data.online_tokenization=false",
                      "model.vocab_size=280", "data.input_path=" .. dir .. "/shards/*.tok" }
    local shards = train.data_source(tiny_cfg(offline))
    expect(shards:batch(1, 8, 32)).to_have_shape({ 8, 33 })
    offline[4] = "data.input_path=" .. text
    expect(err_of(offline)).to_match("not a token shard .* make them with `tetra data prepare")
    os.remove(bin); os.remove(latin); os.execute("rm -rf '" .. dir .. "'")
  end)
end)

describe("training loop", function()
  it("set-up draws what the rank keeps: no parameter or optimizer state is left lazy", function()
    -- the recipe's randn weights are lazy until set-up (tetra.h), and AdamW's state is
    -- lazy zeros; set-up must take their memory and draw them, so that a lack of memory
    -- stops it there, not a step
    local C = require("tetra.ffi").C
    local env = tiny.setup(tiny_cfg())
    local n = 0
    for _, e in ipairs(env.par:placements()) do
      expect(C.tt_tensor_is_lazy(e.tensor)).to_be(0)
      n = n + 1
    end
    for _, list in ipairs({ env.optimizer.m, env.optimizer.v }) do
      for _, t in ipairs(list) do
        expect(C.tt_tensor_is_lazy(t)).to_be(0)
        n = n + 1
      end
    end
    expect(n > 10).to_be(true)
    -- while a randn tensor made outside the set-up stays lazy until read
    local t = tetra.randn(4, 4)
    expect(C.tt_tensor_is_lazy(t)).to_be(1)
    expect(t:sum():item() == t:sum():item()).to_be(true)
    expect(C.tt_tensor_is_lazy(t)).to_be(0)
  end)

  it("gradient accumulation gives the same step as one big batch", function()
    local results = {}
    for _, accum in ipairs({ 1, 4 }) do
      local cfg = tiny_cfg({ "train.gradient_accumulation_steps=" .. accum, "train.steps=2" })
      local env = tiny.setup(cfg)
      local r1, r2 = env.step(), env.step()
      results[accum] = { r1.loss, r1.grad_norm, r2.loss, env.model.output.weight:tolist() }
    end
    expect(results[4][1]).to_be_near(results[1][1], 1e-5)
    expect(results[4][2]).to_be_near(results[1][2], 1e-4)
    expect(results[4][3]).to_be_near(results[1][3], 1e-5)
    expect(results[4][4]).to_be_close(results[1][4], 1e-4, 1e-6)
  end)

  it("writes one metrics record per step with the contract fields", function()
    local path = tmpname(".jsonl")
    local cfg = tiny_cfg({ "train.steps=3", "log.metrics_file=" .. path, "train.eval_every=3",
                           "train.eval_steps=2" })
    local summary = tiny.run(cfg)
    local rows = metrics.read(path)
    os.remove(path)
    expect(#rows).to_be(3)
    for i, r in ipairs(rows) do
      expect(r.step).to_be(i)
      for _, k in ipairs({ "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "step_time_s" }) do
        expect(r[k]).to_be_a("number")
      end
      expect(r.tokens).to_be(i * cfg.train.batch_size * cfg.model.seq_len)
    end
    expect(rows[3].eval_loss).to_be_a("number")
    expect(rows[2].eval_loss).to_be_nil()
    expect(summary.last_loss).to_be_near(rows[3].loss, 1e-6)
  end)

  it("steps at the configured schedule's learning rate (wsd's decay steps and shape)", function()
    local cfg = tiny_cfg({ "train.steps=10", "train.warmup_steps=2", "train.lr_schedule=wsd",
                           "train.lr_decay_steps=4", "train.lr_decay_shape=sqrt",
                           "train.min_lr=0" })
    local env = tiny.setup(cfg)
    local lr = cfg.train.lr
    local want = { lr / 2, lr, lr, lr, lr, lr, lr * (1 - math.sqrt(0.25)),
                   lr * (1 - math.sqrt(0.5)) }
    for _, w in ipairs(want) do
      local r = env.step()
      expect(r.lr).to_be_near(w, 1e-12 * lr)
    end
  end)

  it("evaluate is the mean held-out loss without recording a tape", function()
    local cfg = tiny_cfg({ "train.eval_steps=2" })
    local env = tiny.setup(cfg)
    local got = env.evaluate()
    local want = 0
    for i = 1, 2 do
      local loss = train.loss(env.model, env.data:batch(i, cfg.train.batch_size,
                                                         cfg.model.seq_len, "val"))
      want = want + loss:item() / 2
    end
    expect(got).to_be_near(want, 1e-6)
  end)

  it("learns a byte corpus: the loss falls well below log(256)", function()
    local path = tmpname(".txt")
    local f = assert(io.open(path, "w"))
    for i = 1, 200 do f:write("the quick brown fox jumps over the lazy dog ", i % 7, "\n") end
    f:close()
    local cfg = tiny_cfg({ "data.mock=false", "data.input_path=" .. path, "train.steps=40",
                           "train.lr=1e-2", "train.sample_tokens=0" })
    local summary = tiny.run(cfg)
    os.remove(path)
    expect(summary.first_loss).to_be_near(math.log(256), 0.1)
    expect(summary.last_loss < 2.5).to_be(true)
  end)

  it("trains through tetra.data with a BPE vocabulary trained on the text", function()
    local dir = tmpname("_bpe")
    assert(os.execute("mkdir -p '" .. dir .. "'"))
    local text = dir .. "/text.txt"
    local f = assert(io.open(text, "w"))
    for i = 1, 300 do f:write("the cat sat on the mat, said the dog number ", i % 9, ".\n") end
    f:close()
    tetra.data.train_tokenizer({ text }, 300, dir)
    local cfg = tiny_cfg({ "data.mock=false", "data.input_path=" .. text, "train.steps=25",
                           "data.tokenizer=" .. dir .. "/tokenizer.json", "train.lr=1e-2",
                           "model.vocab_size=300", "train.sample_tokens=0" })
    local data, tok = train.data_source(cfg)
    expect(tok:decode(tok:encode("the cat sat"))).to_be("the cat sat")
    local env = tiny.setup(cfg)
    local first = env.step().loss
    local last
    for _ = 2, 25 do last = env.step().loss end
    os.execute("rm -rf '" .. dir .. "'")
    expect(first).to_be_near(math.log(300), 0.1)
    expect(last < first - 2).to_be(true)
    expect(data).never.to_be_nil()
  end)

  it("generates greedily and with top-k sampling", function()
    local env = tiny.setup(tiny_cfg())
    local a = env.generate({ 1, 2, 3 }, { max_new_tokens = 5, temperature = 0 })
    local b = env.generate({ 1, 2, 3 }, { max_new_tokens = 5, temperature = 0 })
    expect(#a).to_be(5)
    expect(a).to_equal(b)
    local k1 = env.generate({ 1, 2, 3 }, { max_new_tokens = 5, temperature = 1.0, top_k = 1 })
    expect(k1).to_equal(a)
    local s = env.generate({ 1, 2, 3 }, { max_new_tokens = 40, temperature = 1.0, top_k = 50,
                                          seed = 9 })
    for _, id in ipairs(s) do expect(id >= 0 and id < 256).to_be(true) end
    -- Contexts longer than seq_len keep only the last seq_len tokens.
    local long = {}
    for i = 1, 50 do long[i] = i % 256 end
    expect(#env.generate(long, { max_new_tokens = 2, temperature = 0 })).to_be(2)
  end)

  it("pads the window to the layers' row multiple at its end: the same draws", function()
    local generate = require("tetra.train.generate")
    expect(generate.row_multiple(tiny_cfg({ "train.precision=fp8", "train.device=cuda" })))
      .to_be(16)
    expect(generate.row_multiple(tiny_cfg({ "train.precision=fp8" }))).to_be(1)
    expect(generate.row_multiple(tiny_cfg({ "train.precision=bf16", "train.device=cuda" })))
      .to_be(1)
    -- the windows a model gets: multiples of 16 within seq_len (32), the prompt's tokens
    -- first; and env.generate passes the run's multiple on
    local F = tetra.nn.functional
    local widths = {}
    local fake = setmetatable({ parameters = function() return {} end }, { __call =
      function(_, x)
        local w = x:shape()[2]
        widths[#widths + 1] = w
        return F.zeros({ 1, w, 8 })
      end })
    generate.generate(fake, { 5, 6, 7 }, { max_new_tokens = 40, temperature = 0,
                                           seq_len = 32, row_multiple = 16 })
    expect(#widths).to_be(40)
    for i, w in ipairs(widths) do expect(w).to_be(i + 2 <= 16 and 16 or 32) end
    local own = generate.row_multiple
    generate.row_multiple = function() return 16 end
    local opts = { max_new_tokens = 1, temperature = 0 }
    local ok = pcall(tiny.setup(tiny_cfg()).generate, { 1, 2, 3 }, opts)
    generate.row_multiple = own
    expect(ok).to_be(true)
    expect(opts.row_multiple).to_be(16)
    -- FP8 layers on CUDA take rows in multiples of 16 only: a window of 3 to 40 tokens
    -- padded to 16 or 48 draws what the unpadded one does (the CPU runs both)
    for _, precision in ipairs({ "fp32", "fp8" }) do
      local env = tiny.setup(tiny_cfg({ "train.precision=" .. precision }))
      env.step()
      local seen = {}
      local function run(multiple)
        local rows, worst = {}, 0
        local ids = env.generate({ 1, 2, 3 }, {
          max_new_tokens = 38, temperature = 0, row_multiple = multiple,
          on_logits = function(p, V)
            local row = {}
            for i = 0, V - 1 do row[i + 1] = p[i] end
            rows[#rows + 1] = row
          end })
        if seen[1] then
          for k, row in ipairs(rows) do
            for i, v in ipairs(row) do worst = math.max(worst, math.abs(v - seen[1][k][i])) end
          end
        end
        seen[#seen + 1] = rows
        return ids, worst
      end
      local plain = run(1)
      local padded, worst = run(16)
      expect(padded).to_equal(plain)
      expect(worst <= 1e-5).to_be(true)
    end
    -- seq_len 24, not a multiple of 16: the padded context keeps within it (16 tokens), as
    -- GPT-2's learned positions need (a 32-token window would index past them)
    local gpt2 = dofile(here .. "/../../recipes/gpt2.lua")
    local cfg = require("tetra.config").build({ defaults = gpt2.defaults, world_size = false,
      sets = { "model.vocab_size=256", "model.dim=64", "model.n_layers=2", "model.n_heads=4",
               "model.ffn_hidden=128", "model.seq_len=24", "train.batch_size=2" } })
    cfg.log.progress = false
    local env = gpt2.setup(cfg)
    local long = {}
    for i = 1, 30 do long[i] = i end
    expect(#env.generate(long, { max_new_tokens = 3, temperature = 0, row_multiple = 16 }))
      .to_be(3)
  end)

  it("generates from a bf16 head's logits (read as bf16, not as floats)", function()
    local env = tiny.setup(tiny_cfg({ "train.precision=bf16" }))
    local got = env.generate({ 1, 2, 3 }, { max_new_tokens = 1, temperature = 0 })
    local logits
    tetra.nn.functional.no_grad(function()
      logits = env.model(tetra.from_table({ { 1, 2, 3 } }, { dtype = "i64" }))
    end)
    expect(logits.dtype).to_be("bf16")
    local row = logits:float():tolist()[1][3]
    local best = 1
    for i = 2, #row do if row[i] > row[best] then best = i end end
    expect(got[1]).to_be(best - 1)
  end)

  -- On CUDA every read of a device value waits for the device; tests/cuda/step_syncs.sh
  -- counts those waits on a GPU. Here the same step is counted by its reads: the loss
  -- values (F.item) and the optimizer's stats (read_stats).
  it("reads the device once per step: loss, norm and found_inf together", function()
    local F = tetra.nn.functional
    local function reads(sets)
      local env = tiny.setup(tiny_cfg(sets))
      local items, stats = 0, 0
      local item, read = F.item, env.optimizer.read_stats
      F.item = function(...) items = items + 1; return item(...) end
      env.optimizer.read_stats = function(...) stats = stats + 1; return read(...) end
      local ok, err = pcall(function()
        env.step()
        items, stats = 0, 0
        for _ = 1, 3 do env.step() end
      end)
      F.item = item
      if not ok then error(err, 0) end
      return items / 3, stats / 3, env
    end
    local items, stats, env = reads({ "train.gradient_accumulation_steps=2" })
    expect(items).to_be(0)
    expect(stats).to_be(1)
    expect(env.optimizer.step_count).to_be(4)
    items, stats = reads({ "train.gradient_accumulation_steps=2", "train.precision=fp16" })
    expect(items + stats).to_be(1)
    -- a spike check too: the device compares the loss with the guard's limit
    items, stats = reads({ "train.gradient_accumulation_steps=2", "train.spike_zscore=3",
                           "train.spike_window=2" })
    expect(items + stats).to_be(1)
  end)

  -- The spike check on the device: a loss above the limit the guard wrote into the stats
  -- skips the update there (the weights do not move, the step does not count), and the
  -- verdict is the host's formula over the window (z-score above train.spike_zscore).
  it("skips a spike's update on the device, as the z-score over the window says", function()
    local env = tiny.setup(tiny_cfg({ "train.spike_zscore=0.5", "train.spike_window=3",
                                      "train.max_bad_steps=100", "train.steps=14" }))
    local window, spikes, counted = {}, 0, 0
    for step = 1, 14 do
      local before = env.model:named_parameters()[1][2]:float():tolist()
      local r = env.step()
      local z
      if #window >= 3 then
        local m = (window[1] + window[2] + window[3]) / 3
        local sd = math.sqrt(((window[1] - m) ^ 2 + (window[2] - m) ^ 2 + (window[3] - m) ^ 2) / 3)
        z = sd > 0 and (r.loss - m) / sd or nil
      end
      local spike = z ~= nil and z > 0.5
      expect(r.guard == "spike").to_be(spike)
      expect(r.skipped).to_be(spike)
      local after = env.model:named_parameters()[1][2]:float():tolist()
      expect(after[1][1] == before[1][1] and after[2][3] == before[2][3]).to_be(spike)
      if spike then spikes = spikes + 1 else
        counted = counted + 1
        window[#window + 1] = r.loss
        if #window > 3 then table.remove(window, 1) end
      end
    end
    expect(spikes > 0).to_be(true)
    expect(env.optimizer.step_count).to_be(counted)
  end)

  -- train.cuda_graphs: after two eager steps the step is captured once and replayed, its
  -- batch copied into a static input and its learning rate and bias corrections written
  -- into the optimizer's stats before each replay. The check mode runs that protocol on
  -- the CPU (tetra.train.graph): the losses, norms and weights must be those of eager steps,
  -- bit for bit, while the learning rate changes every step (warm-up, then cosine) and,
  -- in fp16, the loss scale too (grown every clean step until the grads overflow: steps
  -- 3, 5 and 8 are skipped, replays that must back the scale off as eager steps do), and
  -- with a spike check the guard's limit (steps 6, 8 and 9 are spikes). An eval after
  -- every step must match too (the weights' cached copies, whose versions the replay's
  -- update does not move on CUDA: the check mode skips ctx's update marks in replays).
  it("replays a captured step as eager steps run (train.cuda_graphs, CPU check)", function()
    for _, case in ipairs({ "fp32", "bf16", "fp16", "fp8", "spike" }) do
      local precision = case == "spike" and "fp32" or case
      local sets = { "train.gradient_accumulation_steps=2", "train.max_grad_norm=0.05",
                     "train.precision=" .. precision, "train.warmup_steps=3",
                     "train.steps=9" }
      if precision == "fp16" then
        sets[#sets + 1] = "train.loss_scale_init=1048576"
        sets[#sets + 1] = "train.loss_scale_growth_interval=1"
      end
      if case == "spike" then
        for _, s in ipairs({ "train.spike_zscore=2.0", "train.spike_window=2",
                             "train.max_bad_steps=100" }) do sets[#sets + 1] = s end
      end
      local eager = tiny.setup(tiny_cfg(sets))
      local graphed = tiny.setup(tiny_cfg(sets), { graph_check = true })
      local lrs, skips = {}, {}
      for step = 1, 9 do
        local a, b = eager.step(), graphed.step()
        expect(b.loss).to_be(a.loss)
        expect(b.skipped).to_be(a.skipped)
        expect(b.loss_scale).to_be(a.loss_scale)
        if not a.skipped then expect(b.grad_norm).to_be(a.grad_norm) end
        if a.skipped then skips[#skips + 1] = step end
        expect(b.lr).to_be(a.lr)
        expect(b.guard).to_be(a.guard)
        lrs[step] = a.lr
        -- an eval between steps reads the weights outside the graph: their fp16 copies
        -- must be those of the weights the replay updated
        expect(graphed.evaluate(1)).to_be(eager.evaluate(1))
        if step > 2 then
          expect(b.graph_s ~= nil).to_be(true)
          expect(b.forward_s).to_be(0)
        else
          expect(b.graph_s).to_be(nil)
        end
      end
      expect(lrs[4] ~= lrs[5] and lrs[5] ~= lrs[6]).to_be(true)
      expect(table.concat(skips, " ")).to_be(({ fp16 = "3 5 8", spike = "6 8 9" })[case] or "")
      expect(graphed.graphs.graph.replays).to_be(7)
      expect(graphed.optimizer.step_count).to_be(9 - #skips)
      local pa, pb = eager.model:named_parameters(), graphed.model:named_parameters()
      for i = 1, #pa do
        local x, y = pa[i][2]:float():tolist(), pb[i][2]:float():tolist()
        expect(#x).to_be(#y)
        local same = true
        local function walk(u, v)
          for k = 1, #u do
            if type(u[k]) == "table" then walk(u[k], v[k]) elseif u[k] ~= v[k] then same = false end
          end
        end
        walk(x, y)
        expect(same).to_be(true)
      end
      -- dropped (as a checkpoint load does), the next step captures again
      graphed.drop_graph()
      expect(graphed.graphs.graph).to_be(nil)
      for _ = 1, 2 do
        local a, b = eager.step(), graphed.step()
        expect(b.loss).to_be(a.loss)
        expect(b.graph_s ~= nil).to_be(true)
      end
      expect(graphed.graphs.graph.replays).to_be(2)
      graphed.drop_graph()
    end
  end)

  -- A config built in code has not met tetra.config's checks: train.setup refuses what a
  -- captured step cannot hold itself, before anything is built.
  it("refuses train.cuda_graphs that cannot be captured in a config built in code", function()
    local cfg = tiny_cfg({ "train.steps=4" })
    cfg.train.cuda_graphs = true   -- on the CPU
    local ok, err = pcall(tiny.setup, cfg)
    expect(ok).to_be(false)
    expect(tostring(err.message or err)).to_match("train%.cuda_graphs replays GPU work and " ..
                                                  "needs train%.device=cuda")
  end)

  it("stops with one line when the step cannot be captured", function()
    local env = tiny.setup(tiny_cfg({ "train.steps=4" }), { graph_check = true })
    env.step()
    env.step()
    -- a read of the norm inside the step, as a hand-written clip might make
    env.optimizer.clip_grad_norm_async = function(self, max_norm)
      getmetatable(self).clip_grad_norm_async(self, max_norm)
      return self:read_stats().grad_norm
    end
    local ok, err = pcall(env.step)
    expect(ok).to_be(false)
    expect(tostring(err)).to_match("^train%.cuda_graphs: capturing step 3 failed: .*read_stats " ..
                                   "inside a captured step reads a device value.*set " ..
                                   "train%.cuda_graphs=false")
    expect(env.graphs.graph).to_be(nil)
  end)

  it("refuses device reads and new memory in a captured step (tetra.train.graph check mode)", function()
    local graph, F = require("tetra.train.graph"), tetra.nn.functional
    local C = require("tetra.ffi").C
    local x = tetra.from_table({ 1, 2, 3 })
    local g = graph.new(C.TT_CPU, { check = true })
    local ok, err = pcall(g.capture, g, function() return F.item(tetra.from_table({ 3 })) end)
    expect(ok).to_be(false)
    expect(tostring(err)).to_match("F%.item inside a captured step reads a device value")
    g:close()
    -- a replay that allocates more than the capture did
    local n, kept = 4, {}
    g = graph.new(C.TT_CPU, { check = true })
    g:capture(function() kept[#kept + 1] = F.scale(x, 2.0) end)
    g:replay()          -- the capture's run
    n = #kept
    ok, err = pcall(g.replay, g)   -- a second tensor kept: the pool must grow
    expect(ok).to_be(false)
    expect(tostring(err)).to_match("a replay took 1 new blocks beyond the capture's memory")
    expect(n).to_be(1)
    for _, t in ipairs(kept) do t:free() end
    g:close()
  end)

  it("rejects a batch that does not split into micro-batches", function()
    -- tetra.config rejects this too; train.setup checks again for configs built in code.
    local cfg = tiny_cfg({ "train.gradient_accumulation_steps=4" })
    cfg.train.batch_size = 6
    expect(function() tiny.setup(cfg) end).to_error("must be a multiple of")
  end)
end)

describe("metrics", function()
  it("encodes the contract fields first and round-trips", function()
    local line = metrics.encode({ tokens_per_s = 10.5, step = 2, zeta = "x", loss = 1.25,
                                  lr = 3e-4, grad_norm = 0 / 0, tokens = 64, step_time_s = 0.5 })
    expect(line).to_match('^{"step":2,"loss":1.25,"lr":0.0003,"grad_norm":null,"tokens":64,')
    local path = tmpname(".jsonl")
    local w = metrics.open(path)
    w:write({ step = 1, loss = 2.5, skipped = false })
    w:close()
    local rows = metrics.read(path)
    os.remove(path)
    expect(rows[1]).to_equal({ step = 1, loss = 2.5, skipped = false })
  end)

  it("formats the progress line", function()
    local line = metrics.progress_line({ step = 12, loss = 3.45123, lr = 3e-4, grad_norm = 0.8123,
                                         tokens_per_s = 12345.4 }, 200, 83)
    expect(line).to_be("step  12/200 | loss 3.4512 | lr 3.00e-04 | gnorm 0.812 | 12,345 tok/s | ETA 1m23s")
  end)
end)
