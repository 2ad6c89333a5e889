-- The cached low-precision weight copies of train.precision = bf16 (engine/lowp_weight.c,
-- tt_linear_lowp in engine/ops_matmul.c) and the in-place weight-gradient GEMM:
--   the copy is cast once per change of the weight (a counter), not once per GEMM, and
--   again after every kind of in-place write (copy_, fill_, axpy_, set, the amp
--   context's optimizer step); an optimizer that wrote the copy itself marks it fresh;
--   tt_linear_lowp equals its definition: x and W rounded to bf16, f32 sums, and in
--   backward the output gradient rounded to bf16 (as the CUDA GEMM rounds it), dW and
--   dX in f32 from f32 sums, db the sum of the unrounded gradient (as the CUDA op's),
--   computed here in float64 from the tensors' values;
--   a weight that already has a gradient gets the next one added by the GEMM itself
--   (beta = 1): one allocation fewer than the first backward, same sums.
local tetra = require("tetra")
local amp = tetra.amp
local C = require("tetra.ffi").C
local T = require("tetra.tensor")

local pout = T.pout
local function lowp_linear(x, w, b) return T.take(C.tt_linear_lowp(x, w, b, C.TT_BF16, pout)) end
local function casts() return tonumber(C.tt_lowp_weight_casts()) end

-- v rounded to bf16 (round to nearest even), as a Lua number.
local function bf16(v)
  local t = tetra.from_table({ v }):cast("bf16"):float()
  return t[0]
end

local function rows_of(t) return t:tolist() end

-- y[i][o] = sum_k round(x[i][k]) round(w[o][k]) + b[o], in float64.
local function ref_forward(x, w, b)
  local y = {}
  for i = 1, #x do
    y[i] = {}
    for o = 1, #w do
      local s = b and b[o] or 0
      for k = 1, #x[1] do s = s + bf16(x[i][k]) * bf16(w[o][k]) end
      y[i][o] = s
    end
  end
  return y
end

local function max_diff(a, b)
  local d = 0
  for i = 1, #a do
    if type(a[i]) == "table" then d = math.max(d, max_diff(a[i], b[i]))
    else d = math.max(d, math.abs(a[i] - b[i])) end
  end
  return d
end

describe("tt_linear_lowp (cpu emulation of the bf16 tensor-core GEMM)", function()
  it("forward: bf16-rounded x and W, f32 sums, plus the bias", function()
    tetra.manual_seed(1)
    local x, w = tetra.randn(5, 7), tetra.randn(3, 7)
    local b = tetra.randn(3)
    local y = lowp_linear(x, w, b)
    local ref = ref_forward(rows_of(x), rows_of(w), b:tolist())
    expect(max_diff(rows_of(y), ref) < 1e-5).to_be(true)
    -- and the rounding is real: the f32 product differs by more than f32 noise
    expect(max_diff(rows_of(tetra.linear(x, w, b)), ref) > 1e-4).to_be(true)
  end)

  it("backward: the output gradient rounded to bf16 for dX and dW, f32 sums", function()
    tetra.manual_seed(2)
    local x = tetra.randn(4, 6):requires_grad_()
    local w = tetra.randn(5, 6):requires_grad_()
    local b = tetra.randn(5):requires_grad_()
    local g = tetra.randn(4, 5)
    local y = lowp_linear(x, w, b)
    y:backward(g)
    local X, W, G = rows_of(x), rows_of(w), rows_of(g)
    local dx, dw, db = {}, {}, {}
    for i = 1, 4 do
      dx[i] = {}
      for k = 1, 6 do
        local s = 0
        for o = 1, 5 do s = s + bf16(G[i][o]) * bf16(W[o][k]) end
        dx[i][k] = s
      end
    end
    for o = 1, 5 do
      dw[o] = {}
      for k = 1, 6 do
        local s = 0
        for i = 1, 4 do s = s + bf16(G[i][o]) * bf16(X[i][k]) end
        dw[o][k] = s
      end
      local s = 0
      for i = 1, 4 do s = s + G[i][o] end   -- the unrounded gradient, as on CUDA
      db[o] = s
    end
    expect(x.grad.dtype).to_be("f32")
    expect(w.grad.dtype).to_be("f32")
    expect(max_diff(rows_of(x.grad), dx) < 1e-5).to_be(true)
    expect(max_diff(rows_of(w.grad), dw) < 1e-5).to_be(true)
    expect(max_diff(b.grad:tolist(), db) < 1e-5).to_be(true)
  end)

  it("refuses bad input with one line", function()
    local ok, err = pcall(lowp_linear, tetra.randn(2, 3), tetra.randn(4, 5))
    expect(ok).to_be(false)
    expect(tostring(err):find("tt_linear_lowp: x is [2, 3] and w is [4, 5]", 1, true) ~= nil)
      .to_be(true)
    ok, err = pcall(function()
      return T.take(C.tt_linear_lowp(tetra.randn(2, 3), tetra.randn(4, 3), nil, C.TT_F32, pout))
    end)
    expect(ok).to_be(false)
    expect(tostring(err):find("compute dtype f32; expected bf16 or f16", 1, true) ~= nil)
      .to_be(true)
  end)
end)

describe("cached low-precision weights", function()
  it("casts once per change of the weight, not once per GEMM", function()
    tetra.manual_seed(3)
    local w = tetra.randn(4, 8):requires_grad_()
    local x = tetra.randn(3, 8)
    local c0 = casts()
    local y1 = lowp_linear(x, w)
    local y2 = lowp_linear(x, w)
    lowp_linear(x, w):sum():backward()
    expect(casts() - c0).to_be(1)
    expect(max_diff(rows_of(y1), rows_of(y2))).to_be(0)
  end)

  it("casts again after every in-place write, and computes with the new values", function()
    tetra.manual_seed(4)
    local w = tetra.randn(4, 8)
    local x = tetra.randn(3, 8)
    lowp_linear(x, w)
    local writes = {
      function() w:copy_(tetra.randn(4, 8)) end,
      function() w:fill_(0.25) end,
      function() w:axpy_(2.0, tetra.randn(4, 8)) end,
      function() w:view(32)[5] = 3.0 end,
      function() w:narrow(0, 1, 2):copy_(tetra.randn(2, 8)) end,   -- through a view
    }
    for i, write in ipairs(writes) do
      write()
      local c0 = casts()
      local y = lowp_linear(x, w)
      expect(casts() - c0).to_be(1)
      local ref = ref_forward(rows_of(x), rows_of(w))
      if max_diff(rows_of(y), ref) >= 1e-5 then error("write " .. i .. ": stale copy used") end
    end
  end)

  it("an optimizer may write the copy itself and mark it fresh", function()
    local w = tetra.from_table({ { 1, 2 }, { 3, 4 } })
    local x = tetra.from_table({ { 1, 1 } })
    lowp_linear(x, w)
    w:copy_(tetra.from_table({ { 10, 20 }, { 30, 40 } }))
    local buf = T.take(C.tt_lowp_weight_buffer(w, C.TT_BF16, pout))
    buf:copy_(tetra.from_table({ { 10, 20 }, { 30, 40 } }))
    C.tt_lowp_weight_mark_fresh(w)
    local c0 = casts()
    local y = lowp_linear(x, w)
    expect(casts() - c0).to_be(0)
    expect(y:tolist()[1][1]).to_be(30)
    expect(y:tolist()[1][2]).to_be(70)
  end)

  it("the amp context re-casts each weight once after the optimizer step", function()
    tetra.manual_seed(5)
    local model = tetra.nn.Linear(8, 4, { bias = true })
    local ctx = amp.wrap(model, "bf16")
    local opt = tetra.optim.SGD(model:parameters(), {})
    local x = tetra.randn(2, 8)
    local c0 = casts()
    for _ = 1, 3 do model:forward(x):sum():backward() end   -- three micro-batches
    expect(casts() - c0).to_be(1)
    ctx:step(model:parameters(), function() opt:step(0.1) end)
    model:zero_grad()
    c0 = casts()
    local y = model:forward(x)
    expect(casts() - c0).to_be(1)
    local ref = ref_forward(rows_of(x), rows_of(model.weight), model.bias:tolist())
    expect(max_diff(rows_of(y), ref) < 1e-5).to_be(true)
    -- an optimizer that bumps the version itself and marks its own copy fresh is trusted
    ctx:step(model:parameters(), function()
      C.tt_tensor_bump_version(model.weight)
      T.take(C.tt_lowp_weight_buffer(model.weight, C.TT_BF16, pout))
      C.tt_lowp_weight_mark_fresh(model.weight)
    end)
    c0 = casts()
    model:forward(x)
    expect(casts() - c0).to_be(0)
  end)
end)

describe("AdamW writes the bf16 copies in its own pass", function()
  -- Three steps of a bf16 model under ctx:step with AdamW, the copies written by the
  -- update or cast before each forward: the same losses to the bit, and no cast after
  -- the first step when the update writes them.
  local Two = tetra.nn.Module:extend("Two")
  function Two:init()
    self:add("a", tetra.nn.Linear(16, 32, { bias = true }))
    self:add("b", tetra.nn.Linear(32, 8, { bias = false }))
  end
  function Two:forward(x) return self.b(self.a(x)) end

  local function run(writes)
    tetra.manual_seed(9)
    local model = Two()
    local ctx = amp.wrap(model, "bf16")
    ctx.optimizer_writes_copies = writes
    local opt = tetra.optim.AdamW(model:parameters(), { lr = 1e-2, weight_decay = 0.1 })
    local x = tetra.randn(4, 16)
    local losses, step_casts = {}, {}
    for s = 1, 4 do
      local c0 = casts()
      local loss = model:forward(x):sum()
      step_casts[s] = casts() - c0
      losses[s] = loss:item()
      loss:backward()
      ctx:step(model:parameters(), function() opt:step(1e-2) end,
               function() return opt:clip_grad_norm(1.0) end, nil, opt)
      model:zero_grad()
    end
    return losses, step_casts, ctx
  end

  it("gives the losses of casting each step, with no cast after the first", function()
    local a, ca, ctx = run(nil)
    local b, cb = run(false)
    expect(type(ctx._written)).to_be("table")
    expect(#ctx._written).to_be(2)   -- the two weights; biases are never cast
    for s = 1, 4 do expect(a[s]).to_be(b[s]) end
    expect(a[4] < a[1]).to_be(true)
    expect(ca).to_equal({ 2, 0, 0, 0 })
    expect(cb).to_equal({ 2, 2, 2, 2 })
  end)
end)

describe("weight gradients accumulated in place (beta = 1)", function()
  it("adds the second gradient inside the GEMM: same sums, one allocation fewer", function()
    tetra.manual_seed(6)
    local w = tetra.randn(16, 32):requires_grad_()
    local x1, x2 = tetra.randn(5, 32), tetra.randn(5, 32)
    local function allocs() return tetra.memory_stats().num_allocs end
    local a0 = allocs()
    tetra.linear(x1, w):sum():backward()
    local first = allocs() - a0
    local g1 = w.grad:clone()
    a0 = allocs()
    tetra.linear(x2, w):sum():backward()
    local second = allocs() - a0
    expect(second).to_be(first - 1)
    w:zero_grad()
    tetra.linear(x2, w):sum():backward()
    local ref = (g1 + w.grad):tolist()
    w:zero_grad()
    tetra.linear(x1, w):sum():backward()
    tetra.linear(x2, w):sum():backward()
    expect(max_diff(w.grad:tolist(), ref) < 1e-5).to_be(true)
  end)
end)

describe("F.add_rms_norm", function()
  it("returns h = x + residual and y = rmsnorm(h) * w, as the two ops apart", function()
    local F = tetra.nn.functional
    tetra.manual_seed(7)
    local x, r, w = tetra.randn(5, 16), tetra.randn(5, 16), tetra.randn(16)
    local h, y = F.add_rms_norm(x, r, w, 1e-5)
    local h2 = x + r
    local y2 = F.rmsnorm(h2, w, 1e-5)
    expect(max_diff(h:tolist(), h2:tolist())).to_be(0)
    expect(max_diff(y:tolist(), y2:tolist()) < 1e-6).to_be(true)
    local _, yb = F.add_rms_norm(x, r, w, 1e-5, "bf16")
    expect(yb.dtype).to_be("bf16")
    expect(max_diff(yb:float():tolist(), y2:tolist()) < 0.05).to_be(true)
    local ok, err = pcall(F.add_rms_norm, x, tetra.randn(5, 15), w)
    expect(ok).to_be(false)
    expect(tostring(err):find("must match x", 1, true) ~= nil).to_be(true)
  end)
end)
