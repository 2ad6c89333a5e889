-- tetra.train.guard: data positions after skipped windows, the roll back's window, the spike
-- z-score, and the state a checkpoint keeps.
local guard = require("tetra.train.guard")

local function new(t)
  local train = { loss_guard = true, spike_zscore = 0, spike_window = 4, max_bad_steps = 3,
                  inject_nan_step = 0, inject_nan_count = 1 }
  for k, v in pairs(t or {}) do train[k] = v end
  return guard.new({ train = train })
end

describe("data positions", function()
  it("are the steps until a window is skipped, then shifted past it", function()
    local g = new()
    expect(g:position(5)).to_be(5)
    -- Steps 7-9 (positions 7-9) bad, rolled back to a checkpoint of step 5.
    for s = 7, 9 do expect(g:finish(s, s, 0 / 0, "nonfinite_loss")).to_be(s == 9) end
    local first, last = g:bad_run()
    local from, pos = g:skip_to_after(5, first, last)
    expect(from).to_be(7)
    expect(pos).to_be(7)
    expect(g:position(6)).to_be(6)
    expect(g:position(7)).to_be(10)
    expect(g:position(20)).to_be(23)
  end)

  it("skip only what the replay would read again when the checkpoint is inside the bad run", function()
    local g = new()
    for s = 7, 9 do g:finish(s, s, 0 / 0, "nonfinite_loss") end
    local first, last = g:bad_run()
    -- A checkpoint saved at step 8 (a skipped step leaves the weights as they were).
    local from, pos = g:skip_to_after(8, first, last)
    expect(from).to_be(9)
    expect(pos).to_be(9)
    expect(g:position(9)).to_be(10)
  end)

  it("compose over two windows and survive a checkpoint", function()
    local g = new()
    for s = 3, 5 do g:finish(s, s, 0 / 0, "nonfinite_loss") end
    g:skip_to_after(2, g:bad_run())
    for s = 10, 12 do g:finish(s, g:position(s), 0 / 0, "nonfinite_loss") end
    g:skip_to_after(9, g:bad_run())
    expect(g:position(3)).to_be(6)
    expect(g:position(10)).to_be(16)
    local h = new()
    h:load_state(g:state())
    expect(h:position(10)).to_be(16)
  end)
end)

describe("the verdict", function()
  it("flags NaN and Inf losses, and a good step ends a bad run", function()
    local g = new()
    expect(g:judge_loss(0 / 0)).to_be("nonfinite_loss")
    expect(g:judge_loss(math.huge)).to_be("nonfinite_loss")
    expect(g:judge_loss(2.5)).to_be(nil)
    g:finish(1, 1, 0 / 0, "nonfinite_loss")
    g:finish(2, 2, 0 / 0, "nonfinite_loss")
    expect(g:finish(3, 3, 2.5, nil)).to_be(false)
    expect(g:finish(4, 4, 0 / 0, "nonfinite_loss")).to_be(false)
  end)

  it("flags a spike by its z-score over the window of good losses, once the window is full", function()
    local g = new({ spike_zscore = 2 })
    for i, x in ipairs({ 1.0, 2.0, 1.0, 2.0 }) do
      expect(g:judge_loss(x)).to_be(nil)
      g:finish(i, i, x, nil)
    end
    -- mean 1.5, std 0.5: 2.5 is z = 2 (not above), 2.6 is z = 2.2.
    expect(g:judge_loss(2.5)).to_be(nil)
    expect(g:judge_loss(2.6)).to_be("spike")
    expect(g:judge_loss(0.1)).to_be(nil)   -- only upward spikes
    -- the device's limit: mean + 2 std; its verdict, when given, is the one used
    expect(g:loss_limit()).to_be(2.5)
    expect(g:judge_loss(1.0, true)).to_be("spike")
    expect(g:judge_loss(9.0, false)).to_be(nil)
    expect(g:judge_loss(0 / 0, false)).to_be("nonfinite_loss")
    -- no limit while the window fills, or without a spread
    expect(new({ spike_zscore = 2 }):loss_limit()).to_be(math.huge)
    local flat = new({ spike_zscore = 2 })
    for i = 1, 4 do flat:finish(i, i, 1.0, nil) end
    expect(flat:loss_limit()).to_be(math.huge)
    expect(new({ spike_zscore = 0 }):loss_limit()).to_be(math.huge)
  end)

  it("does nothing when train.loss_guard is off", function()
    local g = new({ loss_guard = false })
    expect(g:judge_loss(0 / 0)).to_be(nil)
  end)

  it("poisons the data positions the test switch names", function()
    local g = new({ inject_nan_step = 7, inject_nan_count = 2 })
    expect(g:poisoned(6)).to_be(false)
    expect(g:poisoned(7)).to_be(true)
    expect(g:poisoned(8)).to_be(true)
    expect(g:poisoned(9)).to_be(false)
  end)
end)
