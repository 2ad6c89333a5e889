-- The op profile from Lua (tetra.obs.ops over engine/core/op_profile.c; the C side's
-- attribution is held by tests/c/test_op_profile.c with ops of known duration):
-- log.op_profile_step profiles that step alone; its forward entries are the ops the
-- model's forward records (names and counts: the tape's), each run backward once; the
-- step's work outside ops lands in named regions (the optimizer's update); everything
-- adds up to the whole; a checkpointed block's re-run is charged as recompute; an error
-- inside a profile ends it; a config that cannot be profiled is refused (a step past the
-- run's last, CUDA graphs). tests/cli/profile.sh: a resumed run past the step says so.
local tetra = require("tetra")
local C = require("tetra.ffi").C
local config = require("tetra.config")
local ops = require("tetra.obs.ops")

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")
local same = assert(loadfile(here .. "/same_steps.lua"))(expect)
local train = tetra.train

local function entry(prof, name, phase)
  for _, e in ipairs(prof.entries) do
    if e.name == name and e.phase == phase then return e end
  end
  return nil
end

local function expect_adds_up(prof)
  local sum = 0
  for i, e in ipairs(prof.entries) do
    expect(e.seconds >= 0 and e.calls >= 1).to_be(true)
    if i > 1 then expect(e.seconds <= prof.entries[i - 1].seconds).to_be(true) end
    sum = sum + e.seconds
  end
  expect(sum).to_be_near(prof.total_s, 1e-9 * (1 + prof.total_s))
  expect(prof.total_s > 0).to_be(true)
end

-- name -> how many times the model's forward of one batch records it.
local function taped_ops(env, cfg)
  local loss = train.loss(env.model, env.data:batch(1, cfg.train.batch_size,
                                                    cfg.model.seq_len, "train"))
  local counts = {}
  for i = 0, tonumber(C.tt_tape_size()) - 1 do
    local name = require("ffi").string(C.tt_tape_node_name(i))
    counts[name] = (counts[name] or 0) + 1
  end
  C.tt_tape_clear()
  tetra.nn.functional.free(loss)
  env.model:zero_grad()
  return counts
end

describe("log.op_profile_step", function()
  it("profiles that step alone: the tape's ops forward and backward, the update as a region",
     function()
    local cfg = same.build(tiny, { "train.steps=3", "log.op_profile_step=2" })
    local env = tiny.setup(cfg)
    local counts = taped_ops(env, cfg)
    expect(counts.tt_linear).to_be(2 * 7 + 1)   -- q k v o, w1 w2 w3 per block; the head
    env.step()
    expect(env.op_profile).to_be_nil()
    env.step()
    local prof = env.op_profile
    expect(prof).to_be_truthy()
    expect_adds_up(prof)
    local n_fwd = 0
    for _, e in ipairs(prof.entries) do
      if e.phase == "fwd" then
        n_fwd = n_fwd + 1
        expect(counts[e.name] or 0).to_be(e.calls)
        local b = entry(prof, e.name, "bwd")
        expect(b and b.calls).to_be(e.calls)
      end
    end
    local n_taped = 0
    for _ in pairs(counts) do n_taped = n_taped + 1 end
    expect(n_fwd).to_be(n_taped)
    local upd = entry(prof, "optimizer update", "region")
    expect(upd and upd.calls).to_be(1)
    expect(entry(prof, "step start (weights landing, masters away)", "region")).to_be_truthy()
    expect(entry(prof, "after the last backward (gradient reduction)", "region")).to_be_truthy()
    expect(entry(prof, "tt_linear", "recompute")).to_be_nil()
    -- the next step is not profiled (the last profile stays), and the profile is off: a
    -- new one starts cleanly
    env.step()
    expect(env.op_profile).to_be(prof)
    local p = ops.profile(C.TT_CPU, function() end)
    expect(#p.entries).to_be(1)
    expect(p.entries[1].phase).to_be("outside")
  end)

  it("charges a checkpointed block's re-run as recompute", function()
    local cfg = same.build(tiny, { "train.steps=2", "log.op_profile_step=1",
                                   "train.recompute=full" })
    local env = tiny.setup(cfg)
    env.step()
    local prof = env.op_profile
    expect_adds_up(prof)
    expect(entry(prof, "checkpoint", "fwd").calls).to_be(2)
    expect(entry(prof, "checkpoint", "bwd").calls).to_be(2)
    -- the blocks' linears run forward only as re-runs; the head's in the forward
    expect(entry(prof, "tt_linear", "recompute").calls).to_be(2 * 7)
    expect(entry(prof, "tt_linear", "fwd").calls).to_be(1)
    expect(entry(prof, "tt_linear", "bwd").calls).to_be(2 * 7 + 1)
  end)

  it("ends the profile when the profiled work fails, and raises its error", function()
    expect(function()
      ops.profile(C.TT_CPU, function() error("on purpose", 0) end)
    end).to_error("on purpose")
    local p = ops.profile(C.TT_CPU, function() ops.region("r") end)
    expect(entry(p, "r", "region").calls).to_be(1)
  end)

  it("is refused past the run's last step", function()
    expect(function()
      config.build({ defaults = tiny.defaults, world_size = false,
                     sets = { "log.op_profile_step=21", "train.steps=20" } })
    end).to_error("log.op_profile_step = 21: the run has 20 steps (train.steps)")
  end)

  it("is refused with CUDA graphs, whose replayed steps record no ops", function()
    expect(function()
      config.build({ defaults = tiny.defaults, world_size = false,
                     sets = { "log.op_profile_step=3", "train.cuda_graphs=true",
                              "train.device=cuda" } })
    end).to_error("log.op_profile_step with train.cuda_graphs")
  end)
end)
