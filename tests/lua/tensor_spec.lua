-- The tensor metatype (lua/tetra/tensor.lua) against plain Lua arithmetic.
local tetra = require("tetra")

local function lua_matmul(a, b)
  local out = {}
  for i = 1, #a do
    out[i] = {}
    for j = 1, #b[1] do
      local s = 0
      for k = 1, #b do s = s + a[i][k] * b[k][j] end
      out[i][j] = s
    end
  end
  return out
end

describe("creation", function()
  it("from_table keeps shape and values, tolist gives them back", function()
    local src = { { 1, 2, 3 }, { 4, 5, 6 } }
    local t = tetra.from_table(src)
    expect(t:shape()).to_equal({ 2, 3 })
    expect(t.dtype).to_be("f32")
    expect(t.device).to_be("cpu")
    expect(t:tolist()).to_equal(src)
    expect(t:numel()).to_be(6)
    expect(t:size(-1)).to_be(3)
    expect(t:stride()).to_equal({ 3, 1 })
  end)

  it("zeros, ones, full, shape as varargs or a table, dtype options", function()
    expect(tetra.zeros(2, 2):tolist()).to_equal({ { 0, 0 }, { 0, 0 } })
    expect(tetra.ones({ 3 }):tolist()).to_equal({ 1, 1, 1 })
    expect(tetra.full({ 2 }, 2.5):tolist()).to_equal({ 2.5, 2.5 })
    local i = tetra.zeros({ 4 }, { dtype = "i64" })
    expect(i.dtype).to_be("i64")
    expect(tetra.zeros(3, "int32").dtype).to_be("i32")
  end)

  it("arange is i64 for integer bounds and f32 otherwise", function()
    local a = tetra.arange(5)
    expect(a.dtype).to_be("i64")
    expect(a:tolist()).to_equal({ 0, 1, 2, 3, 4 })
    expect(tetra.arange(2, 8, 3):tolist()).to_equal({ 2, 5 })
    local f = tetra.arange(0, 1, 0.25)
    expect(f.dtype).to_be("f32")
    expect(f:tolist()).to_equal({ 0, 0.25, 0.5, 0.75 })
  end)

  it("randn is reproducible under manual_seed and has the requested moments", function()
    tetra.manual_seed(1234)
    local a = tetra.randn(20000):tolist()
    tetra.manual_seed(1234)
    local b = tetra.randn(20000):tolist()
    expect(a).to_equal(b)
    local s, s2 = 0, 0
    for _, v in ipairs(a) do s = s + v; s2 = s2 + v * v end
    local mean, var = s / #a, s2 / #a - (s / #a) ^ 2
    expect(mean).to_be_near(0, 0.03)
    expect(var).to_be_near(1, 0.05)
    local c = tetra.randn({ 1000 }, { mean = 3, std = 0.5 }):tolist()
    local m = 0
    for _, v in ipairs(c) do m = m + v end
    expect(m / #c).to_be_near(3, 0.1)
  end)

  it("rejects unknown dtypes and ragged tables naming the problem", function()
    expect(function() tetra.zeros(2, { dtype = "f33" }) end).to_error("unknown dtype 'f33'")
    expect(function() tetra.from_table({ { 1, 2 }, { 3 } }) end).to_error("ragged")
  end)
end)

describe("arithmetic", function()
  local a_tbl = { { 1, -2, 3 }, { 0.5, 4, -1 } }
  local b_tbl = { { 2, 2, 2 }, { -1, 0.25, 8 } }

  it("tensor op tensor matches Lua elementwise", function()
    local a, b = tetra.from_table(a_tbl), tetra.from_table(b_tbl)
    local ops = {
      { a + b, function(x, y) return x + y end },
      { a - b, function(x, y) return x - y end },
      { a * b, function(x, y) return x * y end },
      { a / b, function(x, y) return x / y end },
    }
    for _, case in ipairs(ops) do
      local ref = {}
      for i = 1, 2 do
        ref[i] = {}
        for j = 1, 3 do ref[i][j] = case[2](a_tbl[i][j], b_tbl[i][j]) end
      end
      expect(case[1]).to_be_close(ref, 1e-6)
    end
  end)

  it("numbers on either side, and unary minus", function()
    local a = tetra.from_table({ 1, 2, 4 })
    expect(a + 1).to_be_close({ 2, 3, 5 })
    expect(1 + a).to_be_close({ 2, 3, 5 })
    expect(a - 1).to_be_close({ 0, 1, 3 })
    expect(10 - a).to_be_close({ 9, 8, 6 })
    expect(a * 3).to_be_close({ 3, 6, 12 })
    expect(0.5 * a).to_be_close({ 0.5, 1, 2 })
    expect(a / 4).to_be_close({ 0.25, 0.5, 1 })
    expect(8 / a).to_be_close({ 8, 4, 2 })
    expect(-a).to_be_close({ -1, -2, -4 })
  end)

  it("broadcasts a row over a matrix", function()
    local m = tetra.from_table({ { 1, 2 }, { 3, 4 } })
    local r = tetra.from_table({ 10, 20 })
    expect(m + r).to_be_close({ { 11, 22 }, { 13, 24 } })
  end)

  it("matmul and linear match a float64 loop", function()
    tetra.manual_seed(7)
    local a, b = tetra.randn(3, 4), tetra.randn(4, 5)
    expect(a:matmul(b)).to_be_close(lua_matmul(a:tolist(), b:tolist()), 1e-5, 1e-6)
    local w = tetra.randn(5, 4)
    local wt = {}
    for i = 1, 4 do
      wt[i] = {}
      for j = 1, 5 do wt[i][j] = w:tolist()[j][i] end
    end
    expect(tetra.linear(a, w)).to_be_close(lua_matmul(a:tolist(), wt), 1e-5, 1e-6)
  end)

  it("reductions over all dims, one dim, keepdim", function()
    local t = tetra.from_table({ { 1, 2, 3 }, { 4, 5, 6 } })
    expect(t:sum():item()).to_be(21)
    expect(t:sum(0)).to_be_close({ 5, 7, 9 })
    expect(t:sum(-1)).to_be_close({ 6, 15 })
    expect(t:sum(1, true)).to_have_shape({ 2, 1 })
    expect(t:mean():item()).to_be_near(3.5)
    expect(t:max(1)).to_be_close({ 3, 6 })
  end)

  it("errors name the op and point at the caller's line", function()
    local a, b = tetra.zeros(2, 3), tetra.zeros(4, 5)
    local ok, err = pcall(function() return a:matmul(b) end)
    expect(ok).to_be(false)
    expect(err).to_match("tensor_spec.lua:%d+:")
    expect(err).to_match("matmul")
  end)
end)

describe("views and elements", function()
  it("view, transpose, permute, narrow, select and contiguous", function()
    local t = tetra.arange(0, 6, 1, "f32"):view(2, 3)
    expect(t:tolist()).to_equal({ { 0, 1, 2 }, { 3, 4, 5 } })
    local tt = t:transpose(0, 1)
    expect(tt:tolist()).to_equal({ { 0, 3 }, { 1, 4 }, { 2, 5 } })
    expect(tt:is_contiguous()).to_be(false)
    expect(tt:contiguous():is_contiguous()).to_be(true)
    expect(t:view(3, -1):shape()).to_equal({ 3, 2 })
    local p = tetra.zeros(2, 3, 4):permute(2, 0, 1)
    expect(p:shape()).to_equal({ 4, 2, 3 })
    expect(t:narrow(1, 1, 2):tolist()).to_equal({ { 1, 2 }, { 4, 5 } })
    expect(t[1]:tolist()).to_equal({ 3, 4, 5 })
    expect(t:select(1, 2):tolist()).to_equal({ 2, 5 })
  end)

  it("t[i] reads and writes elements of a 1-D tensor, 0-based, negative from the end", function()
    local v = tetra.from_table({ 5, 6, 7 })
    expect(v[0]).to_be(5)
    expect(v[-1]).to_be(7)
    v[1] = 42
    expect(v:tolist()).to_equal({ 5, 42, 7 })
    expect(#v).to_be(3)
    expect(function() return v[3] end).to_error("out of range")
  end)

  it("views share storage with their base", function()
    local t = tetra.zeros(2, 2)
    local row = t[0]
    row[1] = 9
    expect(t:tolist()).to_equal({ { 0, 9 }, { 0, 0 } })
  end)

  it("casts round-trip through bf16 with bf16 rounding", function()
    local x = tetra.from_table({ 1, 1.00390625, 3.14159 })
    local y = x:to("bf16")
    expect(y.dtype).to_be("bf16")
    expect(y:float():tolist()).to_be_close({ 1, 1, 3.140625 }, 0, 1e-7)
  end)
end)

describe("autograd", function()
  it("d/dx sum(x * x) = 2x, and .grad is nil before backward", function()
    local x = tetra.from_table({ 1, -2, 3 }, { requires_grad = true })
    expect(x.requires_grad).to_be(true)
    expect(x.grad).to_be_nil()
    local loss = (x * x):sum()
    loss:backward()
    expect(x.grad).to_be_close({ 2, -4, 6 })
    x:zero_grad()
    expect(x.grad).to_be_nil()
  end)

  it("matches finite differences through matmul and silu", function()
    tetra.manual_seed(3)
    local a = tetra.randn(3, 4):requires_grad_()
    local w = tetra.randn(4, 2)
    local function f() return a:matmul(w):silu():sum() end
    f():backward()
    local grad = a.grad:tolist()
    local eps = 1e-2
    local base = a:tolist()
    for i = 1, 3 do
      for j = 1, 4 do
        local plus, minus
        tetra.no_grad(function()
          local p = tetra.from_table(base); p[i - 1][j - 1] = base[i][j] + eps
          local m = tetra.from_table(base); m[i - 1][j - 1] = base[i][j] - eps
          plus = p:matmul(w):silu():sum():item()
          minus = m:matmul(w):silu():sum():item()
        end)
        expect(grad[i][j]).to_be_near((plus - minus) / (2 * eps), 2e-3)
      end
    end
  end)

  it("no_grad records nothing and restores the mode after an error", function()
    local x = tetra.ones(2):requires_grad_()
    local y = tetra.no_grad(function() return x * 2 end)
    expect(y.requires_grad).to_be(false)
    expect(function() tetra.no_grad(function() error("inner") end) end).to_error("inner")
    expect(tetra.is_grad_enabled()).to_be(true)
  end)

  it("assigning nil to .grad drops it", function()
    local x = tetra.ones(2):requires_grad_()
    x:sum():backward()
    expect(x.grad).to_be_close({ 1, 1 })
    x.grad = nil
    expect(x.grad).to_be_nil()
  end)
end)

describe("printing", function()
  it("shows dtype, device, shape and the values", function()
    local s = tostring(tetra.from_table({ { 1, 2 }, { 3, 4 } }))
    expect(s).to_match("f32%[2, 2%] cpu")
    expect(s).to_match("1%.0000")
    expect(s).to_match("4%.0000")
  end)

  it("elides the middle of large tensors", function()
    local s = tostring(tetra.arange(100000):view(1000, 100))
    expect(s).to_match("%.%.%.")
    expect(s).to_match("99999")
    expect(#s < 2000).to_be(true)
  end)
end)

describe("memory", function()
  it("free() releases at once and the GC nudge bounds live bytes in a loop", function()
    local t = tetra.zeros(1024, 1024)
    local held = tetra.memory_stats().live_bytes
    t:free()
    expect(held - tetra.memory_stats().live_bytes).to_be(4 * 1024 * 1024)
    collectgarbage()
    local before = tetra.memory_stats().live_bytes
    local saved = tetra.tensor.gc_threshold
    tetra.tensor.gc_threshold = 64 * 1024 * 1024
    local peak = 0
    for _ = 1, 400 do
      local x = tetra.zeros(1024, 1024) -- 4 MiB each, 1.6 GB without collection
      peak = math.max(peak, tetra.memory_stats().live_bytes)
      x = nil
    end
    tetra.tensor.gc_threshold = saved
    expect(peak - before < 256 * 1024 * 1024).to_be(true)
  end)
end)

describe("reshape (a strided view where the strides allow, else a copy)", function()
  local F = tetra.nn.functional
  local C = require("ffi").C
  local function data(t) return tonumber(require("ffi").cast("intptr_t", C.tt_tensor_data(t))) end

  it("splits a column block's last dim into heads without a copy", function()
    local x = tetra.randn(2, 5, 12)
    local c = x:narrow(2, 4, 8)                    -- (2, 5, 8), rows 12 apart
    local r = F.reshape(c, { 2, 5, 2, 4 })
    expect(r:is_contiguous()).to_be(false)
    expect(data(r)).to_be(data(c))                 -- the same memory
    local X, R = x:tolist(), r:tolist()
    for b = 1, 2 do
      for t = 1, 5 do
        for h = 1, 2 do
          for d = 1, 4 do expect(R[b][t][h][d]).to_be(X[b][t][4 + (h - 1) * 4 + d]) end
        end
      end
    end
    -- writes through the view land in the block and nowhere else
    r:fill_(7)
    local Y = x:tolist()
    for t = 1, 5 do
      expect(Y[1][t][4]).to_be(X[1][t][4])
      expect(Y[1][t][5]).to_be(7)
      expect(Y[2][t][12]).to_be(7)
    end
    -- tt_view keeps its contract: a contiguous result (here a copy)
    local v = F.view(c, { 2, 5, 2, 4 })
    expect(v:is_contiguous()).to_be(true)
    expect(data(v) ~= data(c)).to_be(true)
  end)

  it("merges dims that are one run, and copies what is not viewable", function()
    local x = tetra.randn(2, 5, 12)
    local c = x:narrow(2, 0, 8)
    local rows = F.reshape(c, { 10, 8 })            -- dims 0 and 1 are one run
    expect(data(rows)).to_be(data(c))
    expect(rows:tolist()[7][3]).to_be(x:tolist()[2][2][3])
    local flat = F.reshape(c, { 2, 40 })            -- rows of 8 are 12 apart: a copy
    expect(flat:is_contiguous()).to_be(true)
    expect(flat:tolist()[2][9]).to_be(x:tolist()[2][2][1])
    local tr = F.reshape(x:transpose(0, 1), { 120 })  -- a transpose: a copy
    expect(tr:tolist()[13]).to_be(x:tolist()[2][1][1])
  end)

  it("carries the gradient back through the strided view", function()
    local x = tetra.randn(3, 12):requires_grad_()
    local r = F.reshape(x:narrow(1, 4, 8), { 3, 2, 4 })
    local w = tetra.randn(3, 2, 4)
    ;(r * w):sum():backward()
    local G, W = x.grad:tolist(), w:tolist()
    for i = 1, 3 do
      for j = 1, 12 do
        local want = j > 4 and W[i][math.floor((j - 5) / 4) + 1][(j - 5) % 4 + 1] or 0
        expect(G[i][j]).to_be(want)
      end
    end
  end)
end)
