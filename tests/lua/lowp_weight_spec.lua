-- The cached low-precision weight copies of train.precision = bf16 (engine/optim/lowp_weight.c,
-- tt_linear_lowp in engine/ops/matmul.c) and the in-place weight-gradient GEMM:
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
local tstep = require("tetra.train.step")
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

  it("bf16 output and bf16 input (activations between GEMMs): the f32 sums rounded once",
     function()
    tetra.manual_seed(6)
    local x = tetra.randn(5, 7):requires_grad_()
    local w = tetra.randn(3, 7):requires_grad_()
    local b = tetra.randn(3):requires_grad_()
    local y = T.take(C.tt_linear_lowp_ex(x, w, b, C.TT_BF16, C.TT_BF16, pout))
    expect(y.dtype).to_be("bf16")
    local ref = ref_forward(rows_of(x), rows_of(w), b:tolist())
    local got = rows_of(y:float())
    for i = 1, 5 do
      for o = 1, 3 do
        if got[i][o] ~= bf16(ref[i][o]) then
          -- the one rounding: equal to the float64 sum rounded, or next to it when the f32
          -- sum sits on the other side of a rounding boundary
          expect(math.abs(got[i][o] - ref[i][o]) <= math.abs(ref[i][o]) * 2 ^ -8).to_be(true)
        end
      end
    end
    -- a bf16 x is read as it is (not rounded again), and its gradient comes in bf16
    local xb = x:detach():cast("bf16"):requires_grad_()
    local y2 = T.take(C.tt_linear_lowp(xb, w, b, C.TT_BF16, pout))
    expect(y2.dtype).to_be("bf16")
    expect(max_diff(rows_of(y2:float()), rows_of(y:float()))).to_be(0)
    local g = tetra.randn(5, 3)
    y2:backward(g:cast("bf16"))
    expect(xb.grad.dtype).to_be("bf16")
    expect(w.grad.dtype).to_be("f32")
    local G, W = rows_of(g:cast("bf16"):float()), rows_of(w)
    for i = 1, 5 do
      for k = 1, 7 do
        local s = 0
        for o = 1, 3 do s = s + G[i][o] * bf16(W[o][k]) end
        expect(math.abs(xb.grad:float():tolist()[i][k] - s) <= math.abs(s) * 2 ^ -8 + 1e-6)
          .to_be(true)
      end
    end
  end)

  it("a bf16 activation used by several GEMMs sums its gradients in f32, rounded once",
     function()
    tetra.manual_seed(7)
    local h = tetra.randn(4, 6):cast("bf16"):requires_grad_()
    local w1, w2 = tetra.randn(5, 6), tetra.randn(3, 6)
    local a = T.take(C.tt_linear_lowp(h, w1, nil, C.TT_BF16, pout))
    local c = T.take(C.tt_linear_lowp(h, w2, nil, C.TT_BF16, pout))
    local ga, gc = tetra.randn(4, 5):cast("bf16"), tetra.randn(4, 3):cast("bf16")
    a:backward(ga)
    local first = h.grad:float():tolist()
    c:backward(gc)
    expect(h.grad.dtype).to_be("bf16")
    -- the second contribution alone, then the sum of the two bf16 parts rounded once
    local h2 = h:detach():requires_grad_()
    T.take(C.tt_linear_lowp(h2, w2, nil, C.TT_BF16, pout)):backward(gc)
    local second, got = h2.grad:float():tolist(), h.grad:float():tolist()
    for i = 1, 4 do
      for k = 1, 6 do expect(got[i][k]).to_be(bf16(first[i][k] + second[i][k])) end
    end
  end)

  it("refuses bad input with one line", function()
    local ok0, err0 = pcall(function()
      return T.take(C.tt_linear_lowp_ex(tetra.randn(2, 3), tetra.randn(4, 3), nil, C.TT_BF16,
                                        C.TT_F16, pout))
    end)
    expect(ok0).to_be(false)
    expect(tostring(err0):find("output dtype f16; expected f32 or the compute dtype bf16", 1,
                               true) ~= nil).to_be(true)
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
    tstep.update(ctx, model:parameters(), function() opt:step(0.1) end)
    model:zero_grad()
    c0 = casts()
    local y = model:forward(x)
    expect(casts() - c0).to_be(1)
    local ref = ref_forward(rows_of(x), rows_of(model.weight), model.bias:tolist())
    expect(max_diff(rows_of(y), ref) < 1e-5).to_be(true)
    -- an optimizer that bumps the version itself and marks its own copy fresh is trusted
    tstep.update(ctx, model:parameters(), function()
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
  -- Three steps of a bf16 model under tetra.train.step.update with AdamW, the copies written by the
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
      tstep.update(ctx, model:parameters(), function() opt:step(1e-2) end,
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
    -- drawn now, not at their first use (their memory is not the backward's)
    w:materialize(); x1:materialize(); x2:materialize()
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

describe("tt_linear_lowp_group (fused QKV, fused w1 | w3: one GEMM)", function()
  local ffi = require("ffi")
  local function group(x, ws, bs, out_dtype)
    local n = #ws
    local wa = ffi.new("tt_tensor *[3]", ws)
    local ba = bs and ffi.new("tt_tensor *[3]", bs) or nil
    local outs = ffi.new("tt_tensor *[3]")
    local st = C.tt_linear_lowp_group(x, wa, ba, n, C.TT_BF16, out_dtype, outs)
    if st ~= 0 then error(ffi.string(C.tt_last_error()), 2) end
    local r = {}
    for j = 1, n do r[j] = T.wrap(outs + (j - 1)) end
    return r
  end
  local function ulps_apart(a, b)   -- bf16 values: at most one rounding step apart
    for i = 1, #a do
      if type(a[i]) == "table" then
        if not ulps_apart(a[i], b[i]) then return false end
      elseif math.abs(a[i] - b[i]) > math.abs(b[i]) * 2 ^ -7 + 1e-30 then
        return false
      end
    end
    return true
  end

  for _, case in ipairs({ { "bf16", "bf16", true }, { "bf16", "f32", false },
                          { "f32", "f32", true } }) do
    local xdt, odt, with_bias = case[1], case[2], case[3]
    it(string.format("equals the layers apart: x %s, out %s, %s", xdt, odt,
                     with_bias and "biases" or "no biases"), function()
      tetra.manual_seed(11)
      local function leaf(t) return t:requires_grad_() end
      local x0 = tetra.randn(2, 5, 12)
      local xa = leaf(xdt == "bf16" and x0:cast("bf16") or x0:clone())
      local xb = leaf(xdt == "bf16" and x0:cast("bf16") or x0:clone())
      local sizes = { 8, 4, 4 }
      local wa, wb, ba, bb = {}, {}, {}, {}
      for j = 1, 3 do
        local w, b = tetra.randn(sizes[j], 12), tetra.randn(sizes[j])
        wa[j], wb[j] = leaf(w:clone()), leaf(w:clone())
        ba[j], bb[j] = leaf(b:clone()), leaf(b:clone())
      end
      local odtype = odt == "bf16" and C.TT_BF16 or C.TT_F32
      local fused = group(xa, wa, with_bias and ba or nil, odtype)
      local loss_f, loss_a = 0, 0
      local gs = {}
      for j = 1, 3 do
        local apart = T.take(C.tt_linear_lowp_ex(xb, wb[j], with_bias and bb[j] or nil,
                                                 C.TT_BF16, odtype, pout))
        expect(fused[j].dtype).to_be(odt)
        expect(fused[j]:shape()[3]).to_be(sizes[j])
        expect(ulps_apart(fused[j]:float():tolist(), apart:float():tolist())).to_be(true)
        gs[j] = tetra.randn(2, 5, sizes[j]):cast(odt)
        loss_f = loss_f + (fused[j]:float() * gs[j]:float()):sum()
        loss_a = loss_a + (apart:float() * gs[j]:float()):sum()
      end
      loss_f:backward()
      loss_a:backward()
      local function close(a, b, t)
        for i, v in ipairs(a) do
          if type(v) == "table" then close(v, b[i], t)
          elseif math.abs(v - b[i]) > t * (math.abs(b[i]) + 1e-3) then
            error(string.format("%g vs %g", v, b[i]), 2)
          end
        end
      end
      -- dX from one GEMM: sum_j round(G_j) round(W_j), rounded once to x's dtype (the
      -- layers apart round each part first, so they are no reference here)
      local ref
      for j = 1, 3 do
        local gr = gs[j]:cast("bf16"):float():view(10, sizes[j])
        local wr = wa[j]:detach():cast("bf16"):float()
        local part = tetra.matmul(gr, wr)
        ref = ref and ref + part or part
      end
      local tol = xdt == "bf16" and 2 ^ -8 or 1e-5
      local got = xa.grad:float():view(10, 12):tolist()
      for i, row in ipairs(ref:tolist()) do
        for c, v in ipairs(row) do
          if math.abs(got[i][c] - v) > tol * math.abs(v) + 1e-6 then
            error(string.format("dX[%d][%d] = %g, expected %g", i, c, got[i][c], v))
          end
        end
      end
      expect(xa.grad.dtype).to_be(xdt)
      for j = 1, 3 do
        expect(wa[j].grad.dtype).to_be("f32")
        close(wa[j].grad:tolist(), wb[j].grad:tolist(), 1e-5)
        if with_bias then close(ba[j].grad:tolist(), bb[j].grad:tolist(), 1e-5) end
      end
    end)
  end

  it("casts the group once per change of its weights, and each weight's copy is its block",
     function()
    tetra.manual_seed(12)
    local ws = { tetra.randn(6, 8), tetra.randn(2, 8) }
    local x = tetra.randn(3, 8)
    local c0 = casts()
    group(x, ws, nil, C.TT_F32)
    group(x, ws, nil, C.TT_F32)
    expect(casts() - c0).to_be(2)
    -- a single GEMM of one member reads its block: no cast
    local apart = T.take(C.tt_linear_lowp(x, ws[2], nil, C.TT_BF16, pout))
    expect(casts() - c0).to_be(2)
    expect(max_diff(rows_of(apart), ref_forward(rows_of(x), rows_of(ws[2]))) < 1e-5).to_be(true)
    -- a write to one member casts that block again, in place, and nothing else
    ws[2]:fill_(0.5)
    local out = group(x, ws, nil, C.TT_F32)
    expect(casts() - c0).to_be(3)
    expect(max_diff(rows_of(out[2]:contiguous()), ref_forward(rows_of(x), rows_of(ws[2]))) <
           1e-5).to_be(true)
  end)

  it("adds each weight's next gradient inside its own GEMM (beta = 1)", function()
    tetra.manual_seed(13)
    local ws = { tetra.randn(6, 8):requires_grad_(), tetra.randn(2, 8):requires_grad_() }
    local x1, x2 = tetra.randn(3, 8), tetra.randn(3, 8)
    x2:materialize()   -- drawn now, not in the allocations counted below
    local function run(x)
      local o = group(x, ws, nil, C.TT_F32)
      local total = o[1]:contiguous():sum() + o[2]:contiguous():sum()
      total:backward()
    end
    local function allocs() return tetra.memory_stats().num_allocs end
    run(x1)                                  -- the group's buffer and casts
    for _, w in ipairs(ws) do w:zero_grad() end
    local a0 = allocs()
    run(x1)
    local first = allocs() - a0
    local g1 = { ws[1].grad:clone(), ws[2].grad:clone() }
    a0 = allocs()
    run(x2)
    expect(allocs() - a0).to_be(first - 2)   -- no temporary per weight
    local sums = { ws[1].grad:clone(), ws[2].grad:clone() }
    for _, w in ipairs(ws) do w:zero_grad() end
    run(x2)
    for j = 1, 2 do
      expect(max_diff(sums[j]:tolist(), (g1[j] + ws[j].grad):tolist()) < 1e-5).to_be(true)
    end
  end)

  it("refuses bad input with one line", function()
    local ok, err = pcall(group, tetra.randn(3, 8), { tetra.randn(4, 8), tetra.randn(4, 7) },
                          nil, C.TT_F32)
    expect(ok).to_be(false)
    expect(tostring(err):find("tt_linear_lowp_group: x is [3, 8] and weight 1 is f32 [4, 7]",
                              1, true) ~= nil).to_be(true)
    ok, err = pcall(group, tetra.randn(3, 8), { tetra.randn(4, 8) }, { tetra.randn(3) },
                    C.TT_F32)
    expect(ok).to_be(false)
    expect(tostring(err):find("bias 0 must be f32 [4]", 1, true) ~= nil).to_be(true)
  end)
end)
