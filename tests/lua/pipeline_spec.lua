-- tetra.parallel.pipeline: the split of blocks over stages, the GPipe and 1F1B schedules
-- (each micro-batch's forward and backward once, in an order every stage can follow
-- without waiting forever, with 1F1B's bound on micro-batches in flight) and the model
-- split (a stage keeps exactly its part of the single-process weights). The training
-- itself is checked against the single process by the pipeline rows of
-- tests/dist/layouts.txt.
local tetra = require("tetra")
local pp = require("tetra.parallel.pipeline")
local C = require("tetra.ffi").C

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local llama = dofile(here .. "/../../recipes/llama.lua")

describe("stage_layers", function()
  it("splits uniformly, the remainder on the first stages", function()
    expect(pp.stage_layers(4, 2)).to_equal({ 2, 2 })
    expect(pp.stage_layers(7, 3)).to_equal({ 3, 2, 2 })
    expect(pp.stage_layers(5, 4)).to_equal({ 2, 1, 1, 1 })
  end)

  it("takes explicit counts that add up to n_layers", function()
    expect(pp.stage_layers(5, 2, { 1, 4 })).to_equal({ 1, 4 })
    expect(function() pp.stage_layers(5, 2, { 1, 3 }) end).to_error("add up to 4")
  end)

  it("refuses a stage without blocks", function()
    expect(function() pp.stage_layers(2, 3) end).to_error("at least one")
  end)
end)

-- Runs every stage's ops together: a forward needs the previous stage's forward of that
-- micro-batch, a backward the next stage's backward (the last stage its own forward).
-- Returns the number of rounds, or nil when some stage would wait forever. Also returns
-- the largest number of micro-batches in flight (forward done, backward not) per stage.
local function simulate(kind, S, M)
  local ops, pos, fdone, bdone, peak = {}, {}, {}, {}, {}
  for s = 0, S - 1 do
    ops[s], pos[s], fdone[s], bdone[s], peak[s] = pp.schedule(kind, S, s, M), 1, {}, {}, 0
  end
  local rounds = 0
  while true do
    local finished, moved = true, false
    for s = 0, S - 1 do
      local op = ops[s][pos[s]]
      if op then
        finished = false
        local kind_, m = op[1], op[2]
        local ready
        if kind_ == "F" then
          ready = s == 0 or fdone[s - 1][m]
        else
          ready = fdone[s][m] and (s == S - 1 or bdone[s + 1][m])
        end
        if ready then
          if kind_ == "F" then fdone[s][m] = true else bdone[s][m] = true end
          pos[s], moved = pos[s] + 1, true
          local inflight = 0
          for i = 0, M - 1 do
            if fdone[s][i] and not bdone[s][i] then inflight = inflight + 1 end
          end
          peak[s] = math.max(peak[s], inflight)
        end
      end
    end
    if finished then return rounds, peak end
    if not moved then return nil, peak end
    rounds = rounds + 1
  end
end

describe("schedule", function()
  it("gpipe: every forward, then every backward in reverse", function()
    expect(pp.schedule("gpipe", 2, 0, 3)).to_equal({ { "F", 0 }, { "F", 1 }, { "F", 2 },
                                                     { "B", 2 }, { "B", 1 }, { "B", 0 } })
  end)

  it("1f1b: warm-up forwards, then one forward one backward, then the backwards", function()
    expect(pp.schedule("1f1b", 3, 0, 4)).to_equal({ { "F", 0 }, { "F", 1 }, { "F", 2 },
                                                    { "B", 0 }, { "F", 3 }, { "B", 1 },
                                                    { "B", 2 }, { "B", 3 } })
    expect(pp.schedule("1f1b", 3, 2, 2)).to_equal({ { "F", 0 }, { "B", 0 }, { "F", 1 },
                                                    { "B", 1 } })
  end)

  it("runs each micro-batch once per stage and never deadlocks", function()
    for _, kind in ipairs({ "gpipe", "1f1b" }) do
      for _, sm in ipairs({ { 2, 1 }, { 2, 2 }, { 2, 5 }, { 4, 2 }, { 4, 8 } }) do
        local S, M = sm[1], sm[2]
        for s = 0, S - 1 do
          local seen = {}
          for _, op in ipairs(pp.schedule(kind, S, s, M)) do
            local key = op[1] .. op[2]
            expect(seen[key]).to_be_nil()
            seen[key] = true
          end
          for m = 0, M - 1 do
            expect(seen["F" .. m] and seen["B" .. m]).to_be(true)
          end
        end
        local rounds, peak = simulate(kind, S, M)
        expect(rounds).never.to_be_nil()
        for s = 0, S - 1 do
          expect(peak[s]).to_be(kind == "gpipe" and M or math.min(S - s, M))
        end
      end
    end
  end)

  it("refuses an unknown schedule", function()
    expect(function() pp.schedule("interleaved_1f1b", 2, 0, 2) end).to_error("gpipe or 1f1b")
  end)
end)

describe("split", function()
  local cfg = {
    model = { vocab_size = 64, dim = 32, n_layers = 3, n_heads = 4, n_kv_heads = 2,
              ffn_hidden = 48, seq_len = 8, norm_eps = 1e-5, rope_theta = 10000.0,
              init_std = 0.02 },
    parallel = { pipeline_schedule = "gpipe" },
  }

  local function build()
    C.tt_manual_seed(7)
    return llama.Model(cfg.model)
  end

  local function names(model)
    local out = {}
    for _, np in ipairs(model:named_parameters()) do out[#out + 1] = np[1] end
    return out
  end

  it("keeps each stage's part of the single-process weights, under their names", function()
    local whole = build()
    local full = {}
    for _, np in ipairs(whole:named_parameters()) do full[np[1]] = np[2] end
    local seen = {}
    for stage = 0, 1 do
      local model = build()
      local pipe = pp.split(model, llama.plan.pipeline, { size = 2, rank = stage }, cfg)
      expect(pipe.blocks).to_be(model.layers)
      expect(pipe.is_first).to_be(stage == 0)
      expect(pipe.is_last).to_be(stage == 1)
      expect(#model.layers).to_be(stage == 0 and 2 or 1)
      for _, np in ipairs(model:named_parameters()) do
        expect(seen[np[1]]).to_be_nil()
        seen[np[1]] = true
        expect(np[2]:tolist()).to_equal(full[np[1]]:tolist())
      end
      local n = names(model)
      expect(n[1]).to_be(stage == 0 and "tok_embeddings.weight" or "layers.2.attention_norm.weight")
      expect(n[#n]).to_be(stage == 0 and "layers.1.feed_forward.w3.weight" or "output.weight")
    end
    local count = 0
    for _ in pairs(seen) do count = count + 1 end
    expect(count).to_be(#names(whole))
  end)

  it("runs embed, layers and head as forward does", function()
    local model = build()
    local ids = tetra.from_table({ { 1, 5, 9, 2, 7, 3, 0, 4 } }, { dtype = C.TT_I64 })
    local want = model(ids)
    local h = model.layers(model:embed(ids))
    expect(model:head(h)).to_be_close(want, 1e-6, 1e-7)
  end)
end)
