-- The layer profiler's arithmetic (lua/tetra/cli/profile.lua): the balanced pipeline split
-- against every split there is, and the stage times it is judged by; and its profile of
-- a real model (every part timed, the blocks' activation memory what their saved
-- tensors take).
local profile = require("tetra.cli.profile")
local config = require("tetra.config")

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."

-- parts as the profiler gives them: embedding, blocks, head (forward_s carries the cost).
local function parts_of(emb, blocks, head)
  local parts = { { forward_s = emb, backward_s = 0 } }
  for _, c in ipairs(blocks) do parts[#parts + 1] = { forward_s = c, backward_s = 0 } end
  parts[#parts + 1] = { forward_s = head, backward_s = 0 }
  return parts
end

-- The smallest slowest-stage time over every split of n blocks into S non-empty stages.
local function brute_best(parts, n, S)
  local best = math.huge
  local counts = {}
  local function go(s, left)
    if s == S then
      counts[s] = left
      local st = profile.stage_times(parts, counts)
      local m = 0
      for _, v in ipairs(st) do m = math.max(m, v) end
      best = math.min(best, m)
      return
    end
    for c = 1, left - (S - s) do
      counts[s] = c
      go(s + 1, left - c)
    end
  end
  go(1, n)
  return best
end

-- counts splits n blocks over S stages, each holding at least one.
local function expect_split(counts, n, S)
  local total = 0
  for s = 1, S do
    expect(counts[s] >= 1).to_be(true)
    total = total + counts[s]
  end
  expect(#counts).to_be(S)
  expect(total).to_be(n)
end

describe("tetra profile's split", function()
  it("sums a stage's blocks, the embedding on the first and the head on the last", function()
    local st = profile.stage_times(parts_of(1, { 2, 3, 4, 5 }, 10), { 1, 2, 1 })
    expect(st[1]).to_be(3)
    expect(st[2]).to_be(7)
    expect(st[3]).to_be(15)
  end)

  it("moves blocks off the stage with a heavy head", function()
    local counts = profile.balanced_split(parts_of(0.1, { 1, 1, 1, 1, 1, 1, 1, 1 }, 4), 2)
    expect(table.concat(counts, ",")).to_be("6,2")
  end)

  it("finds the best split there is, on random costs", function()
    math.randomseed(7)
    for _ = 1, 300 do
      local n = math.random(2, 9)
      local S = math.random(2, math.min(n, 4))
      local blocks = {}
      for i = 1, n do blocks[i] = math.random() * (math.random() < 0.2 and 10 or 1) end
      local parts = parts_of(math.random() * 3, blocks, math.random() * 6)
      local counts = profile.balanced_split(parts, S)
      expect_split(counts, n, S)
      local m = 0
      for _, v in ipairs(profile.stage_times(parts, counts)) do m = math.max(m, v) end
      expect(m).to_be_near(brute_best(parts, n, S), 1e-12)
    end
  end)
end)

-- parts with separate forward and backward costs.
local function parts_fb(list)
  local parts = {}
  for i, fb in ipairs(list) do parts[i] = { forward_s = fb[1], backward_s = fb[2] } end
  return parts
end

describe("tetra profile's prediction", function()
  it("replays 1F1B: the slow stage's work back to back, the other's fill and drain", function()
    -- Stage 0 (embedding free, one block) F 1 B 2; stage 1 (one block, head free) F 3 B 4;
    -- 4 micro-batches: F0 on stage 0, then stage 1 busy 4 x 7, then stage 0's last B:
    -- 1 + 28 + 2 = 31 (where (m + S - 1) x the slowest stage would say 35).
    local parts = parts_fb({ { 0, 0 }, { 1, 2 }, { 3, 4 }, { 0, 0 } })
    expect(profile.predict(parts, { 1, 1 }, 4, "1f1b")).to_be_near(31, 1e-12)
    -- GPipe: all forwards, then all backwards. Stage 1's forwards end at 1 + 4 x 3 = 13,
    -- its backwards at 13 + 16 = 29; stage 0's last backward waits for micro-batch 0's on
    -- stage 1 (the last one it runs): 29 + 2.
    expect(profile.predict(parts, { 1, 1 }, 4, "gpipe")).to_be_near(31, 1e-12)
    -- One micro-batch: everything in a row.
    expect(profile.predict(parts, { 1, 1 }, 1, "1f1b")).to_be_near(10, 1e-12)
  end)

  it("takes a block across when the fill and drain make that faster", function()
    -- Blocks (F/B) 3/4, 1/2, 4/2 over two stages, 3 micro-batches: 1,2 has the smaller
    -- slowest stage (7 against 8) but 2,1 the shorter step (32 against 34): its first
    -- stage's fill and drain are shorter.
    local parts = parts_fb({ { 0, 0 }, { 3, 4 }, { 1, 2 }, { 4, 2 }, { 0, 0 } })
    expect(table.concat(profile.balanced_split(parts, 2), ",")).to_be("1,2")
    expect(profile.predict(parts, { 1, 2 }, 3, "1f1b")).to_be_near(34, 1e-12)
    local counts, t = profile.best_split(parts, 2, 3, "1f1b")
    expect(table.concat(counts, ",")).to_be("2,1")
    expect(t).to_be_near(32, 1e-12)
  end)

  it("moves blocks to where the predicted step is shortest", function()
    math.randomseed(11)
    for _ = 1, 200 do
      local n = math.random(2, 9)
      local S = math.random(2, math.min(n, 4))
      local m = math.random(1, 8)
      local list = { { math.random(), math.random() } }
      for i = 1, n do list[i + 1] = { math.random(), 2 * math.random() } end
      list[n + 2] = { 3 * math.random(), 6 * math.random() }
      local parts = parts_fb(list)
      local counts, t = profile.best_split(parts, S, m, "1f1b")
      expect_split(counts, n, S)
      expect(t).to_be_near(profile.predict(parts, counts, m, "1f1b"), 1e-12)
      -- never worse than the split that only balances the slowest stage
      local even = profile.predict(parts, profile.balanced_split(parts, S), m, "1f1b")
      expect(t <= even + 1e-12).to_be(true)
    end
  end)
end)

describe("tetra profile's timings", function()
  it("times every part of a real model; a block's activations are its saved tensors", function()
    local recipe = dofile(here .. "/../../recipes/llama.lua")
    -- dim 64, ffn 96, 2 x 16 tokens, 4 heads; f32.
    local cfg = config.build({ defaults = recipe.defaults, world_size = false, sets = {
      "model.dim=64", "model.n_layers=3", "model.ffn_hidden=96", "model.vocab_size=128",
      "model.seq_len=16", "model.n_heads=4", "model.n_kv_heads=4", "train.batch_size=2" } })
    local prof = profile.profile(recipe, cfg, 2)
    expect(#prof.parts).to_be(5)
    expect(prof.parts[1].name).to_be("embedding")
    expect(prof.parts[2].name).to_be("layers.0")
    expect(prof.parts[5].name).to_be("head + loss")
    for _, p in ipairs(prof.parts) do
      expect(p.forward_s > 0 and p.backward_s > 0).to_be(true)
    end
    -- Each block keeps at least its output (2 x 16 x 64 floats) and at most what its
    -- ops could save: a few dozen (B, T, dim)-sized tensors and its MLP's hidden ones.
    local out = 2 * 16 * 64 * 4
    for i = 2, 4 do
      local a = prof.parts[i].act_bytes
      expect(a >= out).to_be(true)
      expect(a <= 40 * out).to_be(true)
    end
    expect(prof.parts[2].act_bytes).to_be(prof.parts[3].act_bytes)
    -- The head keeps at least its logits (2 x 16 x 128 floats).
    expect(prof.parts[5].act_bytes >= 2 * 16 * 128 * 4).to_be(true)
  end)

  it("sees a block made costlier by replacing its MLP (tests/fixtures/heavy_first.lua)", function()
    local recipe = dofile(here .. "/../fixtures/heavy_first.lua")
    local cfg = config.build({ defaults = recipe.defaults, world_size = false, sets = {
      "model.dim=32", "model.n_layers=3", "model.ffn_hidden=32", "model.first_ffn_hidden=512",
      "model.vocab_size=64", "model.seq_len=8", "train.batch_size=2",
      "train.gradient_accumulation_steps=1", "parallel.pipeline_parallel_size=1" } })
    local prof = profile.profile(recipe, cfg, 1)
    -- The first block's MLP keeps (2 x 8 x 512) hidden activations where the others keep
    -- (2 x 8 x 32): the block that runs is the replaced one.
    local extra = 3 * 2 * 8 * (512 - 32) * 4
    expect(prof.parts[2].act_bytes >= prof.parts[3].act_bytes + extra / 2).to_be(true)
    expect(prof.parts[3].act_bytes).to_be(prof.parts[4].act_bytes)
  end)
end)
