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

-- Runs every stage's ops together, each stage in its own order (receives block, sends do
-- not): a forward of virtual stage vs needs the forward of vs - 1, a backward of vs the
-- backward of vs + 1 (the last one its own forward). Stage s holds virtual stages
-- s, s + S, ... (v chunks). Returns the number of rounds, or nil when some stage would
-- wait forever, and per stage the largest number of micro-batch chunks in flight.
local function simulate(kind, S, M, v)
  v = v or 1
  local V = S * v
  local ops, pos, fdone, bdone, peak = {}, {}, {}, {}, {}
  for s = 0, S - 1 do ops[s], pos[s], peak[s] = pp.schedule(kind, S, s, M, v), 1, 0 end
  for vs = 0, V - 1 do fdone[vs], bdone[vs] = {}, {} end
  local rounds = 0
  while true do
    local finished, moved = true, false
    for s = 0, S - 1 do
      local op = ops[s][pos[s]]
      if op then
        finished = false
        local kind_, m, c = op[1], op[2], op[3]
        local vs = c * S + s
        local ready
        if kind_ == "F" then
          ready = vs == 0 or fdone[vs - 1][m]
        else
          ready = fdone[vs][m] and (vs == V - 1 or bdone[vs + 1][m])
        end
        if ready then
          if kind_ == "F" then fdone[vs][m] = true else bdone[vs][m] = true end
          pos[s], moved = pos[s] + 1, true
          local inflight = 0
          for cc = 0, v - 1 do
            for i = 0, M - 1 do
              if fdone[cc * S + s][i] and not bdone[cc * S + s][i] then inflight = inflight + 1 end
            end
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

-- Every (micro-batch, chunk) forward and backward exactly once in each stage's ops.
local function expect_each_once(ops, M, v)
  local seen = {}
  for _, op in ipairs(ops) do
    local key = op[1] .. op[2] .. ":" .. op[3]
    expect(seen[key]).to_be_nil()
    seen[key] = true
  end
  for m = 0, M - 1 do
    for c = 0, v - 1 do
      expect(seen["F" .. m .. ":" .. c] and seen["B" .. m .. ":" .. c]).to_be(true)
    end
  end
end

describe("schedule", function()
  it("gpipe: every forward, then every backward in reverse", function()
    expect(pp.schedule("gpipe", 2, 0, 3)).to_equal({ { "F", 0, 0 }, { "F", 1, 0 }, { "F", 2, 0 },
                                                     { "B", 2, 0 }, { "B", 1, 0 }, { "B", 0, 0 } })
  end)

  it("1f1b: warm-up forwards, then one forward one backward, then the backwards", function()
    expect(pp.schedule("1f1b", 3, 0, 4)).to_equal({ { "F", 0, 0 }, { "F", 1, 0 }, { "F", 2, 0 },
                                                    { "B", 0, 0 }, { "F", 3, 0 }, { "B", 1, 0 },
                                                    { "B", 2, 0 }, { "B", 3, 0 } })
  end)

  it("runs each micro-batch once per stage and never deadlocks", function()
    for _, kind in ipairs({ "gpipe", "1f1b" }) do
      for _, sm in ipairs({ { 2, 1 }, { 2, 2 }, { 2, 5 }, { 4, 2 }, { 4, 8 } }) do
        local S, M = sm[1], sm[2]
        for s = 0, S - 1 do expect_each_once(pp.schedule(kind, S, s, M), M, 1) end
        local rounds, peak = simulate(kind, S, M)
        expect(rounds).never.to_be_nil()
        for s = 0, S - 1 do
          expect(peak[s]).to_be(kind == "gpipe" and M or math.min(S - s, M))
        end
      end
    end
  end)

  it("interleaved 1f1b: each chunk of each micro-batch once, no deadlock, a smaller bubble", function()
    for _, svm in ipairs({ { 2, 2, 2 }, { 2, 2, 4 }, { 2, 3, 6 }, { 4, 2, 4 }, { 4, 2, 8 },
                           { 4, 3, 8 }, { 3, 2, 9 } }) do
      local S, v, M = svm[1], svm[2], svm[3]
      for s = 0, S - 1 do expect_each_once(pp.schedule("interleaved_1f1b", S, s, M, v), M, v) end
      local rounds = simulate("interleaved_1f1b", S, M, v)
      expect(rounds).never.to_be_nil()
      -- A round runs one chunk (1 / v of a stage's blocks): 1F1B over whole stages takes
      -- v rounds per op. Interleaving must take fewer rounds: a bubble v times smaller.
      local plain = simulate("1f1b", S, M)
      expect(rounds < plain * v).to_be(true)
    end
  end)

  -- The interleaved schedule's transfers in rounds (pp.rounds, pp.transfer_groups) under
  -- NCCL's order: each stage's groups run one after another; a transfer
  -- happens when the sender's and the receiver's groups holding it are both current (a
  -- send waits for its receiver), and a group ends when all of its transfers have. Nil
  -- when some stage would wait for good; also nil when the messages from one stage to
  -- another are not received in the order they are sent (NCCL matches by order alone).
  local function transfers_finish(S, v, M)
    local V, groups = S * v, {}
    for s = 0, S - 1 do
      local rounds = pp.rounds(pp.schedule("interleaved_1f1b", S, s, M, v))
      local function key(x) return x.kind .. x.micro .. ":" .. x.vs end
      local gs = {}
      for _, g in ipairs(pp.transfer_groups(rounds, s, S, V)) do
        local one = {}
        for _, x in ipairs(g.sends) do
          one[#one + 1] = { send = true, peer = x.peer, msg = key(x) }
        end
        for _, x in ipairs(g.recvs) do
          one[#one + 1] = { send = false, peer = x.peer, msg = key(x) }
        end
        gs[#gs + 1] = one
      end
      groups[s] = gs
    end
    for s = 0, S - 1 do   -- the order of each direction's messages
      for p = 0, S - 1 do
        local sent, got = {}, {}
        for _, g in ipairs(groups[s]) do
          for _, x in ipairs(g) do if x.send and x.peer == p then sent[#sent + 1] = x.msg end end
        end
        for _, g in ipairs(groups[p]) do
          for _, x in ipairs(g) do if not x.send and x.peer == s then got[#got + 1] = x.msg end end
        end
        if table.concat(sent, " ") ~= table.concat(got, " ") then return nil end
      end
    end
    local at = {}
    for s = 0, S - 1 do at[s] = 1 end
    while true do
      local moved, left = false, false
      for s = 0, S - 1 do
        for _, x in ipairs(groups[s][at[s]] or {}) do
          for _, y in ipairs(groups[x.peer][at[x.peer]] or {}) do
            if not x.done and not y.done and y.peer == s and y.msg == x.msg and
               y.send ~= x.send then
              x.done, y.done, moved = true, true, true
            end
          end
        end
      end
      for s = 0, S - 1 do
        local g = groups[s][at[s]]
        if g then
          left = true
          local all = true
          for _, x in ipairs(g) do all = all and x.done == true end
          if all then at[s], moved = at[s] + 1, true end
        end
      end
      if not left then return true end
      if not moved then return nil end
    end
  end

  it("interleaved 1f1b: every stage's transfers finish under NCCL's order", function()
    local n = 0
    for S = 2, 8 do
      for v = 2, 4 do
        for k = 1, 4 do
          expect(transfers_finish(S, v, S * k)).to_be(true)
          n = n + 1
        end
      end
    end
    expect(n).to_be(84)
  end)

  it("refuses an unknown schedule, and interleaving with micro-batches stages do not divide", function()
    expect(function() pp.schedule("zigzag", 2, 0, 2) end).to_error("gpipe, 1f1b or interleaved_1f1b")
    expect(function() pp.schedule("interleaved_1f1b", 2, 0, 3, 2) end).to_error("multiple of")
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
