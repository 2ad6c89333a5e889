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
      local total = 0
      for s = 1, S do
        expect(counts[s] >= 1).to_be(true)
        total = total + counts[s]
      end
      expect(total).to_be(n)
      local m = 0
      for _, v in ipairs(profile.stage_times(parts, counts)) do m = math.max(m, v) end
      expect(m).to_be_near(brute_best(parts, n, S), 1e-12)
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
end)
