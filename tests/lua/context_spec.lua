-- tetra.parallel.context: the chunk assignment and the token slicing of context
-- parallelism, against hand-written positions; the context-parallel attention without
-- positions (one rank holding a whole sequence, as in generation) equals nn.Attention.
-- The gathered attention itself is checked against the single process by
-- the context-parallel rows of tests/dist/layouts.txt.
local tetra = require("tetra")
local cp = require("tetra.parallel.context")
local F = require("tetra.nn.functional")
local C = require("tetra.ffi").C
local ffi = require("ffi")

local function ints(t)
  local n = t:numel()
  local p = ffi.cast("int64_t *", C.tt_tensor_data(t))
  local out = {}
  for i = 0, n - 1 do out[i + 1] = tonumber(p[i]) end
  return out
end

describe("chunk_positions", function()
  it("gives rank r chunks r and 2cp-1-r", function()
    expect(cp.chunk_positions(8, 2, 0)).to_equal({ 0, 1, 6, 7 })
    expect(cp.chunk_positions(8, 2, 1)).to_equal({ 2, 3, 4, 5 })
    expect(cp.chunk_positions(16, 4, 1)).to_equal({ 2, 3, 12, 13 })
    expect(cp.chunk_positions(16, 4, 3)).to_equal({ 6, 7, 8, 9 })
  end)

  it("refuses a length that 2 x cp does not divide", function()
    expect(function() cp.chunk_positions(10, 3, 0) end).to_error("divisible by 2 x")
  end)
end)

describe("slice", function()
  it("takes this rank's tokens, the ones after them and their positions", function()
    -- tokens (2, 9): row b holds 100 b + i at column i
    local tok = F.empty({ 2, 9 }, C.TT_I64)
    local p = ffi.cast("int64_t *", C.tt_tensor_data(tok))
    for b = 0, 1 do for i = 0, 8 do p[b * 9 + i] = 100 * b + i end end
    local ids, targets, pos = cp.slice(tok, { size = 2, rank = 1 })
    expect(ids).to_have_shape({ 2, 4 })
    expect(ints(ids)).to_equal({ 2, 3, 4, 5, 102, 103, 104, 105 })
    expect(ints(targets)).to_equal({ 3, 4, 5, 6, 103, 104, 105, 106 })
    expect(ints(pos)).to_equal({ 2, 3, 4, 5 })
    ids, targets, pos = cp.slice(tok, { size = 2, rank = 0 })
    expect(ints(ids)).to_equal({ 0, 1, 6, 7, 100, 101, 106, 107 })
    expect(ints(targets)).to_equal({ 1, 2, 7, 8, 101, 102, 107, 108 })
    expect(ints(pos)).to_equal({ 0, 1, 6, 7 })
  end)

  it("widens i32 tokens to i64 ids and targets", function()
    local tok = F.empty({ 1, 9 }, C.TT_I32)
    local p = ffi.cast("int32_t *", C.tt_tensor_data(tok))
    for i = 0, 8 do p[i] = 2000000000 + i end
    local ids, targets = cp.slice(tok, { size = 2, rank = 0 })
    expect(ids._dtype == C.TT_I64 and targets._dtype == C.TT_I64).to_be(true)
    expect(ints(ids)).to_equal({ 2000000000, 2000000001, 2000000006, 2000000007 })
    expect(ints(targets)).to_equal({ 2000000001, 2000000002, 2000000007, 2000000008 })
  end)
end)

describe("apply", function()
  it("leaves attention on a whole sequence (no positions) as nn.Attention computes it", function()
    local cfg = { dim = 16, n_heads = 4, n_kv_heads = 2 }
    tetra.manual_seed(3)
    local ref = tetra.nn.Attention(cfg)
    tetra.manual_seed(3)
    local att = tetra.nn.Attention(cfg)
    cp.apply(att, { size = 2, rank = 0 })
    expect(rawget(att, "attend")).never.to_be_nil()
    local x = tetra.randn({ 2, 8, 16 })
    local a, b = ref(x):tolist(), att(x):tolist()
    local worst = 0.0
    for i = 1, #a do
      for j = 1, #a[i] do
        for k = 1, #a[i][j] do worst = math.max(worst, math.abs(a[i][j][k] - b[i][j][k])) end
      end
    end
    expect(worst).to_be(0.0)
  end)
end)
