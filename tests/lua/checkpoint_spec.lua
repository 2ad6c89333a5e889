-- tetra.checkpoint: a run interrupted at step 6 and resumed from its checkpoint must
-- reproduce the uninterrupted run's steps 7..12 bit for bit (fp32 and fp16 with its loss
-- scaler); the save is atomic (a leftover temporary directory is ignored, `latest`
-- names a complete checkpoint), keep prunes, and bad checkpoints fail with clear errors.
local tetra = require("tetra")
local checkpoint = require("tetra.checkpoint")
local json = require("tetra.util.json")
local config = require("tetra.config")
local metrics = tetra.metrics
local train = tetra.train

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")

local function tiny_cfg(sets)
  local cfg = config.build({ defaults = tiny.defaults, sets = sets or {}, world_size = false })
  cfg.log.progress = false
  return cfg
end

local dirs = {}
local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  dirs[#dirs + 1] = d
  return d
end

local function rm_rf(path) os.execute("rm -rf '" .. path .. "'") end

local function listdir(path) return require("tetra.host").listdir(path) or {} end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- Steps first..last of env: { {loss, grad_norm, lr, loss_scale}, ... } by step.
local function run_steps(env, first, last, out)
  out = out or {}
  for step = first, last do
    expect(env.step_count + 1).to_be(step)
    local r = env.step()
    out[step] = { r.loss, r.grad_norm, r.lr, r.loss_scale, r.skipped }
  end
  return out
end

local function expect_identical(a, b, first, last)
  for step = first, last do
    for k = 1, 5 do
      if a[step][k] ~= b[step][k] then
        error(("step %d field %d: %s uninterrupted vs %s resumed"):format(
          step, k, tostring(a[step][k]), tostring(b[step][k])), 2)
      end
    end
  end
end

-- 12 steps in one go vs 6 steps, a save, and a fresh setup resuming 6 more.
local function check_resume(sets)
  local dir = tmpdir()
  local base = { "train.steps=12", "checkpoint.dir=" .. dir }
  for _, s in ipairs(sets) do base[#base + 1] = s end
  local full = run_steps(tiny.setup(tiny_cfg(base)), 1, 12)

  local first = tiny.setup(tiny_cfg(base))
  local part = run_steps(first, 1, 6)
  checkpoint.save(first)
  expect_identical(full, part, 1, 6)

  local resumed_sets = { "checkpoint.resume=true" }
  for _, s in ipairs(base) do resumed_sets[#resumed_sets + 1] = s end
  local env = tiny.setup(tiny_cfg(resumed_sets))
  expect(env.resumed_from).to_be(dir .. "/step_000006")
  expect(env.step_count).to_be(6)
  expect(env.optimizer.step_count).to_be(6)
  run_steps(env, 7, 12, part)
  expect_identical(full, part, 7, 12)
  return full
end

describe("checkpoint resume", function()
  after_each(function()
    for _, d in ipairs(dirs) do rm_rf(d) end
    dirs = {}
  end)

  it("fp32: steps 7..12 after a resume are bit-identical to the uninterrupted run", function()
    check_resume({})
  end)

  -- train.cuda_graphs: a resumed process warms up again before it captures (its first
  -- steps make the handles, workspaces and plans a capture may not make), where counting
  -- by step number captured the resumed run's first step. The CPU check mode.
  it("cuda_graphs: a resumed run runs two eager steps before it captures", function()
    local dir = tmpdir()
    local base = { "train.steps=8", "checkpoint.dir=" .. dir }
    local first = tiny.setup(tiny_cfg(base), { graph_check = true })
    for step = 1, 4 do
      expect(first.step().graph_s ~= nil).to_be(step > 2)
    end
    checkpoint.save(first)
    local sets = { "checkpoint.resume=true" }
    for _, s in ipairs(base) do sets[#sets + 1] = s end
    local env = tiny.setup(tiny_cfg(sets), { graph_check = true })
    expect(env.step_count).to_be(4)
    for step = 5, 8 do
      expect(env.step().graph_s ~= nil).to_be(step > 6)
    end
  end)

  it("fp16: the loss-scaler state resumes too (scale grows during the run)", function()
    local full = check_resume({ "train.precision=fp16", "train.loss_scale_init=1024",
                                "train.loss_scale_growth_interval=4" })
    expect(full[12][4] > full[1][4]).to_be(true)   -- the scale moved after the checkpoint
  end)

  it("tetra.data: the loader state resumes (BPE text, steps 7..12 bit-identical)", function()
    local dir = tmpdir()
    os.execute("mkdir -p '" .. dir .. "'")
    local text = dir .. "/text.txt"
    local f = assert(io.open(text, "w"))
    for i = 1, 200 do f:write("the cat sat on the mat, said the dog number ", i % 7, ".\n") end
    f:close()
    tetra.data.train_tokenizer({ text }, 300, dir)
    local full = check_resume({ "data.mock=false", "data.input_path=" .. text,
                                "data.tokenizer=" .. dir .. "/tokenizer.json",
                                "model.vocab_size=300", "train.sample_tokens=0" })
    expect(full[12][1] < full[1][1]).to_be(true)
  end)

  it("train.run saves every N steps, keeps 2, resumes from latest and keeps the metrics", function()
    local dir = tmpdir()
    local mfile = dir .. ".jsonl"
    local sets = { "train.steps=8", "checkpoint.dir=" .. dir, "checkpoint.every=3",
                   "log.metrics_file=" .. mfile }
    train.run(tiny.setup(tiny_cfg(sets)))
    expect(listdir(dir)).to_equal({ "latest", "step_000006", "step_000008" })
    expect(read(dir .. "/latest")).to_be("step_000008\n")
    local full = metrics.read(mfile)

    -- As if the job died after step 7: latest at 6, metrics of 1..7 on disk.
    rm_rf(dir .. "/step_000008")
    local f = assert(io.open(dir .. "/latest", "w")); f:write("step_000006\n"); f:close()
    sets[#sets + 1] = "checkpoint.resume=true"
    local env = tiny.setup(tiny_cfg(sets))
    local out = train.run(env)
    expect(#out.records).to_be(2)
    expect(out.records[1].step).to_be(7)
    local again = metrics.read(mfile)
    expect(#again).to_be(8)
    for i = 1, 8 do
      expect(again[i].step).to_be(i)
      expect(again[i].loss).to_be(full[i].loss)
      expect(again[i].grad_norm).to_be(full[i].grad_norm)
    end
    os.remove(mfile)
  end)

  it("ignores a leftover temporary directory; latest names a complete checkpoint", function()
    local dir = tmpdir()
    local sets = { "train.steps=12", "checkpoint.dir=" .. dir }
    local env = tiny.setup(tiny_cfg(sets))
    run_steps(env, 1, 2)
    checkpoint.save(env)
    -- A save that died half-way: a temporary directory with a partial file.
    os.execute("mkdir -p '" .. dir .. "/.tmp.step_000003'")
    local f = assert(io.open(dir .. "/.tmp.step_000003/model.safetensors", "wb"))
    f:write("partial"); f:close()
    sets[#sets + 1] = "checkpoint.resume=true"
    local resumed = tiny.setup(tiny_cfg(sets))
    expect(resumed.resumed_from).to_be(dir .. "/step_000002")
    local latest = dir .. "/" .. read(dir .. "/latest"):gsub("%s+$", "")
    for _, name in ipairs({ "model.safetensors", "optim.safetensors", "state.json" }) do
      expect(io.open(latest .. "/" .. name) ~= nil).to_be(true)
    end
    run_steps(resumed, 3, 3)
    checkpoint.save(resumed)          -- a later save clears the leftover
    expect(listdir(dir)).to_equal({ "latest", "step_000002", "step_000003" })
  end)

  it("restores the engine RNG state", function()
    local C = require("tetra.ffi").C
    local env = tiny.setup(tiny_cfg({ "checkpoint.dir=" .. tmpdir() }))
    C.tt_manual_seed(42)
    local saved = tostring(C.tt_rng_state())
    local path = checkpoint.save(env)
    C.tt_manual_seed(7)
    expect(tostring(C.tt_rng_state())).never.to_be(saved)
    checkpoint.load(env, path)
    expect(tostring(C.tt_rng_state())).to_be(saved)
  end)

  it("keep prunes the oldest checkpoints", function()
    local dir = tmpdir()
    local env = tiny.setup(tiny_cfg({ "train.steps=12", "checkpoint.dir=" .. dir,
                                      "checkpoint.keep=2" }))
    for step = 1, 4 do
      run_steps(env, step, step)
      checkpoint.save(env)
    end
    expect(listdir(dir)).to_equal({ "latest", "step_000003", "step_000004" })
  end)

  it("names the tensor and both shapes when the model does not match", function()
    local dir = tmpdir()
    local env = tiny.setup(tiny_cfg({ "checkpoint.dir=" .. dir }))
    checkpoint.save(env)
    expect(function()
      tiny.setup(tiny_cfg({ "checkpoint.dir=" .. dir, "checkpoint.resume=true",
                            "model.ffn_hidden=96" }))
    end).to_error("has shape [128, 64] in the checkpoint but [96, 64] in the model")
  end)

  it("names the path of a missing or corrupt checkpoint", function()
    local dir = tmpdir()
    expect(function()
      tiny.setup(tiny_cfg({ "checkpoint.resume=" .. dir .. "/step_000005" }))
    end).to_error(dir .. "/step_000005 is not a checkpoint directory")
    local env = tiny.setup(tiny_cfg({ "checkpoint.dir=" .. dir }))
    checkpoint.save(env)
    local ck = dir .. "/step_000000"
    os.rename(ck .. "/optim.safetensors", ck .. "/optim.bak")
    expect(function() checkpoint.load(env, ck) end).to_error(ck .. "/optim.safetensors is missing")
    os.rename(ck .. "/optim.bak", ck .. "/optim.safetensors")
    local f = assert(io.open(ck .. "/state.json", "w")); f:write("{\"step\": 0,"); f:close()
    expect(function()
      tiny.setup(tiny_cfg({ "checkpoint.dir=" .. dir, "checkpoint.resume=true" }))
    end).to_error(ck .. "/state.json is corrupt")
  end)

  it("checks the checkpoint to resume before any model is built", function()
    local dir = tmpdir()
    -- A model whose build would take seconds and gigabytes: the error comes first.
    local cfg = config.build({ defaults = tiny.defaults, world_size = false, sets = {
      "train.model_name=llama-1b", "checkpoint.resume=" .. dir .. "/step_000007" } })
    -- What the allocator held at its peak tells whether the 1B model (gigabytes of
    -- weights) was built, where a clock would only tell how busy the machine was.
    local T = require("tetra.tensor")
    require("ffi").C.tt_alloc_reset_peak(T.device("cpu"))
    local before = T.memory_stats("cpu").live_bytes
    local ok, err = pcall(tiny.setup, cfg)
    expect(ok).to_be(false)
    expect(err.message).to_match("step_000007 is not a checkpoint directory")
    expect(T.memory_stats("cpu").peak_bytes - before < 64 * 2 ^ 20).to_be(true)
  end)

  it("names the newest complete checkpoint when latest points nowhere", function()
    local dir = tmpdir()
    local env = tiny.setup(tiny_cfg({ "checkpoint.dir=" .. dir, "checkpoint.keep=0" }))
    run_steps(env, 1, 1)
    checkpoint.save(env)
    run_steps(env, 2, 2)
    checkpoint.save(env)   -- latest: step_000002
    rm_rf(dir .. "/step_000002")
    expect(function()
      tiny.setup(tiny_cfg({ "checkpoint.dir=" .. dir, "checkpoint.resume=true" }))
    end).to_error("latest names " .. dir .. "/step_000002, which is missing; the newest " ..
                  "complete checkpoint is " .. dir .. "/step_000001: resume from it with " ..
                  "--set checkpoint.resume=" .. dir .. "/step_000001")
  end)

  it("refuses NaN weights at load, naming the parameter", function()
    local dir = tmpdir()
    local env = tiny.setup(tiny_cfg({ "checkpoint.dir=" .. dir }))
    checkpoint.save(env)
    local file = dir .. "/step_000000/model.safetensors"
    local entries = {}
    for _, np in ipairs(env.model:named_parameters()) do
      local t = np[2]:detach():contiguous()
      if np[1] == "norm.weight" then require("tetra.ffi").check(tetra.ffi.C.tt_fill_(t, 0 / 0)) end
      entries[#entries + 1] = { np[1], t }
    end
    require("tetra.io").save(file, entries)
    -- With its checksum the rewritten file is corrupt; without (a checkpoint written
    -- before checksums, or by a run that diverged) the NaN weights are what is refused.
    expect(function()
      tiny.setup(tiny_cfg({ "checkpoint.dir=" .. dir, "checkpoint.resume=true" }))
    end).to_error("model.safetensors is corrupt (CRC-32C ")
    os.remove(dir .. "/step_000000/checksums.json")
    expect(function()
      tiny.setup(tiny_cfg({ "checkpoint.dir=" .. dir, "checkpoint.resume=true" }))
    end).to_error("parameter 'norm.weight' holds NaN or Inf values")
  end)

  it("names a checkpoint file whose bytes changed (CRC-32C)", function()
    local dir = tmpdir()
    local env = tiny.setup(tiny_cfg({ "checkpoint.dir=" .. dir }))
    checkpoint.save(env)
    local file = dir .. "/step_000000/optim.safetensors"
    local bytes = read(file)
    local at = #bytes - 100                       -- inside the tensor data
    local f = assert(io.open(file, "wb"))
    f:write(bytes:sub(1, at - 1), string.char((bytes:byte(at) + 1) % 256), bytes:sub(at + 1))
    f:close()
    expect(function()
      tiny.setup(tiny_cfg({ "checkpoint.dir=" .. dir, "checkpoint.resume=true" }))
    end).to_error(file .. " is corrupt (CRC-32C ")
  end)

  it("checks a safetensors file by its blocks, and refuses block sums of another size", function()
    local dir = tmpdir()
    local env = tiny.setup(tiny_cfg({ "checkpoint.dir=" .. dir }))
    checkpoint.save(env)
    local ck = dir .. "/step_000000"
    local sums = json.decode(read(ck .. "/checksums.json"))
    local entry = sums["model.safetensors"]
    expect(type(entry)).to_be("table")
    local size = #read(ck .. "/model.safetensors")
    expect(#entry.blocks / 8).to_be(math.ceil(size / entry.block))
    expect(entry.block).to_be(tonumber(tetra.ffi.C.tt_checksum_block(size)))
    expect(entry.crc).to_be(require("tetra.checkpoint.dir").crc_of(ck .. "/model.safetensors"))
    entry.blocks = entry.blocks:sub(9)   -- one block fewer than the file has
    local f = assert(io.open(ck .. "/checksums.json", "wb"))
    f:write(json.encode(sums))
    f:close()
    expect(function()
      tiny.setup(tiny_cfg({ "checkpoint.dir=" .. dir, "checkpoint.resume=true" }))
    end).to_error(ck .. "/model.safetensors is corrupt (" .. size .. " bytes, where " ..
                  "checksums.json sums " .. (#entry.blocks / 8) .. " blocks of " .. entry.block)
  end)

  it("splits a flat range into boxes that cover it in order, each contiguous", function()
    local flat_boxes = require("tetra.checkpoint.shards").flat_boxes
    for _, shape in ipairs({ { 7 }, { 3, 5 }, { 2, 3, 4 }, { 2, 1, 3, 2 } }) do
      local numel, strides = 1, {}
      for d = #shape, 1, -1 do strides[d] = numel; numel = numel * shape[d] end
      for first = 0, numel - 1 do
        for last = first + 1, numel do
          local boxes, at = flat_boxes(shape, first, last), first
          expect(#boxes <= 2 * #shape - 1).to_be(true)
          for _, b in ipairs(boxes) do
            -- the box's elements in row-major order must be at, at + 1, ...
            local idx = {}
            for d = 1, #shape do idx[d] = b.lo[d] end
            repeat
              local flat = 0
              for d = 1, #shape do flat = flat + idx[d] * strides[d] end
              if flat ~= at then
                error(("shape {%s}, [%d, %d): element %d where %d was due"):format(
                  table.concat(shape, ","), first, last, flat, at))
              end
              at = at + 1
              local d = #shape
              while d >= 1 do
                idx[d] = idx[d] + 1
                if idx[d] < b.hi[d] then break end
                idx[d] = b.lo[d]
                d = d - 1
              end
            until d < 1
          end
          expect(at).to_be(last)
        end
      end
    end
  end)

  -- checkpoint.dir alone saved nothing (a run lost at its end); its folder was first
  -- made at the first save, after the training.
  it("train.run with checkpoint.dir alone saves at the last step", function()
    local dir = tmpdir()
    train.run(tiny.setup(tiny_cfg({ "train.steps=3", "checkpoint.dir=" .. dir })))
    expect(listdir(dir)).to_equal({ "latest", "step_000003" })
    local cfg = tiny_cfg({ "checkpoint.dir=" .. dir, "checkpoint.every=4" })
    local due = {}
    for step = 1, 10 do due[step] = checkpoint.due(cfg, step, 10) end
    expect(due).to_equal({ false, false, false, true, false, false, false, true, false, true })
    expect(checkpoint.due(tiny_cfg({}), 10, 10)).to_be(false)
  end)

  it("refuses a checkpoint.dir it cannot make at set-up, not at the first save", function()
    local dir = tmpdir()
    local f = assert(io.open(dir, "w")); f:close()
    expect(function() tiny.setup(tiny_cfg({ "checkpoint.dir=" .. dir .. "/ck" })) end)
      .to_error("checkpoint.dir: cannot create the folder " .. dir .. "/ck: Not a directory")
    os.remove(dir)
  end)

  it("starts fresh when resume=true finds no checkpoint yet", function()
    local env = tiny.setup(tiny_cfg({ "checkpoint.dir=" .. tmpdir(), "checkpoint.resume=true" }))
    expect(env.resumed_from).to_be_nil()
    expect(env.step_count).to_be(0)
  end)

  it("rejects checkpoint.every without checkpoint.dir", function()
    expect(function() tiny_cfg({ "checkpoint.every=5" }) end)
      .to_error("checkpoint.every needs checkpoint.dir")
  end)

  it("round-trips state JSON exactly", function()
    local v = { a = 0.1, b = { 1, 2, 3 }, c = "x\"y\n", d = true, e = 2^60, f = {} }
    local back = json.decode(json.encode(v))
    expect(back.a).to_be(0.1)
    expect(back.b).to_equal({ 1, 2, 3 })
    expect(back.c).to_be("x\"y\n")
    expect(back.d).to_be(true)
    expect(back.e).to_be(2^60)
    expect(function() json.decode("{\"a\": }") end).to_error("offset")
  end)
end)
