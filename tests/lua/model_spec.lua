-- tetra.nn: the Module protocol, layer numerics against float64 loops, initialisation,
-- grouped-query attention, causality and hooks. (End-to-end numerics against PyTorch are
-- in parity_spec.lua.)
local ffi = require("ffi")
local tetra = require("tetra")
local nn = tetra.nn
local F = nn.functional
local C = ffi.C

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local llama = dofile(here .. "/../../recipes/llama.lua")
local gpt2 = dofile(here .. "/../../recipes/gpt2.lua")
local qwen2 = dofile(here .. "/../../recipes/qwen2/model.lua")

local TINY = { vocab_size = 64, dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2,
               ffn_hidden = 48, seq_len = 8, norm_eps = 1e-5, rope_theta = 10000.0,
               init_std = 0.02 }

local function ids_tensor(rows)
  return tetra.from_table(rows, { dtype = "i64" })
end

local function stats(t)
  local v = t:tolist()
  local flat = {}
  local function walk(x) if type(x) == "table" then for _, y in ipairs(x) do walk(y) end else flat[#flat + 1] = x end end
  walk(v)
  local sum, sq = 0, 0
  for _, x in ipairs(flat) do sum = sum + x end
  local mean = sum / #flat
  for _, x in ipairs(flat) do sq = sq + (x - mean) ^ 2 end
  return mean, math.sqrt(sq / (#flat - 1)), flat
end

describe("Module", function()
  it("names parameters by path in registration order", function()
    tetra.manual_seed(1)
    local m = llama.Model(TINY)
    local names = {}
    for _, np in ipairs(m:named_parameters()) do names[#names + 1] = np[1] end
    expect(names[1]).to_be("tok_embeddings.weight")
    expect(names[2]).to_be("layers.0.attention_norm.weight")
    expect(names[3]).to_be("layers.0.attention.wq.weight")
    expect(names[10]).to_be("layers.0.feed_forward.w3.weight")
    expect(names[#names - 1]).to_be("norm.weight")
    expect(names[#names]).to_be("output.weight")
    expect(#names).to_be(2 + 9 * TINY.n_layers + 1)
  end)

  it("counts parameters", function()
    local c = TINY
    local hd = c.dim / c.n_heads
    local per_layer = 2 * c.dim + c.dim * c.n_heads * hd * 2 + c.dim * c.n_kv_heads * hd * 2 +
                      3 * c.dim * c.ffn_hidden
    local expected = 2 * c.vocab_size * c.dim + c.n_layers * per_layer + c.dim
    expect(llama.Model(c):num_params()).to_be(expected)
  end)

  it("shares a tied embedding once", function()
    local cfg = { vocab_size = 64, dim = 32, n_layers = 1, n_heads = 4, ffn_hidden = 64,
                  seq_len = 8, norm_eps = 1e-5 }
    local m = gpt2.Model(cfg)
    local names = {}
    for _, np in ipairs(m:named_parameters()) do names[np[1]] = true end
    expect(names["wte.weight"]).to_be(true)
    expect(#m:parameters()).to_be(#m:named_parameters())
    local tied = llama.Model(setmetatable({ tie_embeddings = true }, { __index = TINY }))
    expect(tetra.key(tied.output.weight)).to_be(tetra.key(tied.tok_embeddings.weight))
    expect(tied:num_params()).to_be(llama.Model(TINY):num_params() - TINY.vocab_size * TINY.dim)
  end)

  it("lists children, finds submodules, toggles train/eval", function()
    local m = llama.Model(TINY)
    local kids = {}
    for _, c in ipairs(m:children()) do kids[#kids + 1] = c[1] end
    expect(kids).to_equal({ "tok_embeddings", "layers", "norm", "output" })
    expect(m:get("layers.1.attention.wq")).to_be(m.layers[2].attention.wq)
    expect(m:get("layers.7")).to_be_nil()
    m:eval()
    expect(m.layers[1].attention.training).to_be(false)
    m:train()
    expect(m.layers[1].attention.training).to_be(true)
  end)

  it("zero_grad drops every gradient", function()
    local m = llama.Model(TINY)
    local loss = F.cross_entropy(m(ids_tensor({ { 1, 2, 3, 4 } })), ids_tensor({ { 2, 3, 4, 5 } }))
    loss:backward()
    expect(m.norm.weight.grad).never.to_be_nil()
    m:zero_grad()
    for _, p in ipairs(m:parameters()) do expect(p.grad).to_be_nil() end
  end)

  it("load_state_dict copies values and rejects missing or misshapen entries", function()
    local a, b = llama.Model(TINY), llama.Model(TINY)
    b:load_state_dict(a:state_dict())
    expect(b.output.weight).to_be_close(a.output.weight, 0, 0)
    expect(function() b:load_state_dict({}) end).to_error("missing parameter")
    local sd = a:state_dict()
    sd["norm.weight"] = tetra.zeros(3)
    expect(function() b:load_state_dict(sd) end).to_error("elements")
  end)

  it("runs forward hooks, lets them replace the output, and removes them", function()
    local lin = nn.Linear(4, 2)
    local seen
    local h = lin:register_forward_hook(function(_, out, x)
      seen = { out:shape(), x:shape() }
    end)
    lin(tetra.randn(3, 4))
    expect(seen).to_equal({ { 3, 2 }, { 3, 4 } })
    h.remove()
    seen = nil
    lin(tetra.randn(3, 4))
    expect(seen).to_be_nil()
    local h2 = lin:register_forward_hook(function(_, out) return out * 0 end)
    expect(lin(tetra.randn(3, 4)):tolist()).to_equal({ { 0, 0 }, { 0, 0 }, { 0, 0 } })
    h2.remove()
  end)
end)

describe("layers", function()
  it("Linear computes x W^T + b", function()
    local lin = nn.Linear(3, 2, { bias = true })
    lin.weight:copy_(tetra.from_table({ { 1, 2, 3 }, { -1, 0.5, 2 } }))
    lin.bias:copy_(tetra.from_table({ 0.25, -1 }))
    local y = lin(tetra.from_table({ { 1, 1, 1 }, { 2, 0, -1 } }))
    expect(y).to_be_close({ { 6.25, 0.5 }, { -0.75, -5 } }, 1e-6)
  end)

  it("Embedding looks rows up", function()
    local e = nn.Embedding(4, 2)
    e.weight:copy_(tetra.from_table({ { 0, 1 }, { 2, 3 }, { 4, 5 }, { 6, 7 } }))
    expect(e(ids_tensor({ 3, 0, 3 }))).to_be_close({ { 6, 7 }, { 0, 1 }, { 6, 7 } }, 0, 0)
  end)

  it("RMSNorm and LayerNorm match float64 formulas", function()
    local x = { { 1, -2, 3, 0.5 }, { 0.1, 0.2, -0.3, 4 } }
    local w = { 0.5, 1, 1.5, 2 }
    local rms, ln = nn.RMSNorm(4, 1e-5), nn.LayerNorm(4, 1e-5)
    rms.weight:copy_(tetra.from_table(w))
    ln.weight:copy_(tetra.from_table(w))
    ln.bias:copy_(tetra.from_table({ 0.1, 0, -0.1, 0.2 }))
    local want_rms, want_ln = {}, {}
    for r, row in ipairs(x) do
      local ms, mean, var = 0, 0, 0
      for _, v in ipairs(row) do ms = ms + v * v / 4; mean = mean + v / 4 end
      for _, v in ipairs(row) do var = var + (v - mean) ^ 2 / 4 end
      want_rms[r], want_ln[r] = {}, {}
      for i, v in ipairs(row) do
        want_rms[r][i] = v / math.sqrt(ms + 1e-5) * w[i]
        want_ln[r][i] = (v - mean) / math.sqrt(var + 1e-5) * w[i] + ({ 0.1, 0, -0.1, 0.2 })[i]
      end
    end
    expect(rms(tetra.from_table(x))).to_be_close(want_rms, 1e-5, 1e-6)
    expect(ln(tetra.from_table(x))).to_be_close(want_ln, 1e-5, 1e-6)
  end)

  it("ModuleList is an array and chains forward", function()
    local list = nn.ModuleList({ nn.Linear(4, 4), nn.Linear(4, 4) })
    expect(#list).to_be(2)
    local x = tetra.randn(2, 4)
    local want = list[2](list[1](x))
    expect(list(x)).to_be_close(want, 0, 0)
    expect(list:named_parameters()[1][1]).to_be("0.weight")
  end)
end)

describe("initialisation", function()
  it("draws N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 L)), norms 1", function()
    tetra.manual_seed(7)
    local cfg = setmetatable({ dim = 128, ffn_hidden = 256, n_heads = 4, n_kv_heads = 4,
                               n_layers = 8 }, { __index = TINY })
    local m = llama.Model(cfg)
    local _, s = stats(m.layers[1].attention.wq.weight)
    expect(s).to_be_near(0.02, 0.05 * 0.02)
    local resid = 0.02 / math.sqrt(2 * cfg.n_layers)
    _, s = stats(m.layers[3].attention.wo.weight)
    expect(s).to_be_near(resid, 0.05 * resid)
    _, s = stats(m.layers[3].feed_forward.w2.weight)
    expect(s).to_be_near(resid, 0.05 * resid)
    local mean
    mean, s = stats(m.layers[1].ffn_norm.weight)
    expect(mean).to_be(1)
    expect(s).to_be(0)
  end)
end)

describe("Attention", function()
  it("with grouped kv heads equals full attention with each kv head repeated", function()
    tetra.manual_seed(3)
    local gqa = nn.Attention { dim = 16, n_heads = 4, n_kv_heads = 2 }
    local mha = nn.Attention { dim = 16, n_heads = 4, n_kv_heads = 4 }
    mha.wq.weight:copy_(gqa.wq.weight)
    mha.wo.weight:copy_(gqa.wo.weight)
    -- Query head h reads kv head h // 2: kv rows [g*4, g*4+4) go to heads 2g and 2g+1.
    for _, name in ipairs({ "wk", "wv" }) do
      local src, dst = gqa[name].weight, mha[name].weight
      for h = 0, 3 do
        local g = math.floor(h / 2)
        dst:narrow(0, h * 4, 4):copy_(src:narrow(0, g * 4, 4))
      end
    end
    local x = tetra.randn(2, 5, 16)
    expect(gqa(x)).to_be_close(mha(x), 1e-5, 1e-7)
  end)

  it("is causal: logits at t do not depend on tokens after t", function()
    local m = llama.Model(TINY)
    local a = m(ids_tensor({ { 5, 6, 7, 8, 9, 10 } }))
    local b = m(ids_tensor({ { 5, 6, 7, 40, 41, 42 } }))
    expect(a:narrow(1, 0, 3)).to_be_close(b:narrow(1, 0, 3), 1e-6, 1e-7)
    expect(a:narrow(1, 3, 1)).never.to_be_close(b:narrow(1, 3, 1), 1e-3, 0)
  end)

  it("applies RoPE: a shifted sequence gives the same attention pattern", function()
    -- With RoPE only relative positions matter, so the last position's output for
    -- [a b c] equals the last output for the same tokens placed at positions 2..4.
    tetra.manual_seed(5)
    -- Weights large enough that the attention weights are far from uniform.
    local attn = nn.Attention { dim = 16, n_heads = 2, std = 0.5 }
    local x = tetra.randn(1, 3, 16)
    local plain = attn(x)
    local shifted = attn(x, tetra.from_table({ 2, 3, 4 }, { dtype = "i64" }))
    expect(shifted).to_be_close(plain, 1e-4, 1e-6)
    -- ... and they do matter: the same tokens twice as far apart attend differently
    -- (without rotation the positions could not change anything).
    local spread = attn(x, tetra.from_table({ 0, 2, 4 }, { dtype = "i64" }))
    local a, b = spread:tolist()[1], plain:tolist()[1]
    local diff = 0
    for t = 2, 3 do
      for j = 1, 16 do diff = math.max(diff, math.abs(a[t][j] - b[t][j])) end
    end
    expect(diff > 0.1).to_be(true)   -- measured 6.5
    attn.rope = false
    expect(attn(x, tetra.from_table({ 0, 2, 4 }, { dtype = "i64" }))).to_be_close(attn(x), 1e-6, 1e-7)
    local no_rope = nn.Attention { dim = 16, n_heads = 2, rope = false }
    expect(no_rope.rope).to_be(false)
  end)
end)

describe("models", function()
  it("Llama and GPT-2 map (B, T) ids to (B, T, V) logits with finite loss", function()
    local ids = ids_tensor({ { 1, 2, 3, 4 }, { 4, 3, 2, 1 } })
    local l = llama.Model(TINY)(ids)
    expect(l).to_have_shape({ 2, 4, 64 })
    local g = gpt2.Model({ vocab_size = 64, dim = 32, n_layers = 2, n_heads = 4,
                           ffn_hidden = 64, seq_len = 8, norm_eps = 1e-5 })(ids)
    expect(g).to_have_shape({ 2, 4, 64 })
    -- At init the logits are near zero, so the loss is close to log(V).
    local loss = F.cross_entropy(l, ids):item()
    expect(loss).to_be_near(math.log(64), 0.02)
  end)

  -- recipes/qwen2/: Llama's weights, drawn in the same order, plus zero q, k, v biases.
  it("Qwen2 is Llama with biases on q, k and v", function()
    tetra.manual_seed(3)
    local l = llama.Model(TINY)
    tetra.manual_seed(3)
    local q = qwen2.Model(TINY)
    local names = {}
    for _, np in ipairs(q:named_parameters()) do names[#names + 1] = np[1] end
    expect(names[4]).to_be("layers.0.attention.wq.bias")
    expect(names[6]).to_be("layers.0.attention.wk.bias")
    expect(names[8]).to_be("layers.0.attention.wv.bias")
    expect(names[9]).to_be("layers.0.attention.wo.weight")
    local dkv = TINY.n_kv_heads * TINY.dim / TINY.n_heads
    expect(q:num_params()).to_be(l:num_params() + TINY.n_layers * (TINY.dim + 2 * dkv))
    local ids = ids_tensor({ { 1, 2, 3, 4 }, { 4, 3, 2, 1 } })
    expect(q(ids)).to_be_close(l(ids), 0, 0)
    -- A value bias b adds b to every attention output row (softmax rows sum to 1), so
    -- the block's attention output moves by wo b at every position.
    local attn_q, attn_l = q.layers[1].attention, l.layers[1].attention
    tetra.no_grad(function() attn_q.wv.bias:copy_(F.randn({ dkv }, 1.0)) end)
    local bias, wo = attn_q.wv.bias:tolist(), attn_l.wo.weight:tolist()
    local hd, group = TINY.dim / TINY.n_heads, TINY.n_heads / TINY.n_kv_heads
    local shift = {}
    for j = 1, TINY.dim do
      shift[j] = 0
      for i = 1, TINY.dim do   -- query head h reads key/value head floor(h / group)
        local h, k = math.floor((i - 1) / hd), (i - 1) % hd
        shift[j] = shift[j] + wo[j][i] * bias[math.floor(h / group) * hd + k + 1]
      end
    end
    local x = F.randn({ 1, 4, TINY.dim }, 1.0)
    local with, without = attn_q(x):tolist(), attn_l(x):tolist()
    local worst = 0
    for t = 1, 4 do
      for j = 1, TINY.dim do
        worst = math.max(worst, math.abs(with[1][t][j] - without[1][t][j] - shift[j]))
      end
    end
    expect(worst < 1e-5).to_be(true)
    expect(q(ids)).never.to_be_close(l(ids), 1e-3, 0)
  end)

  -- The residual add before each block's second norm runs fused with it (one pass over
  -- memory): the tape holds the fused op's nodes, not an add and a norm apart; a norm
  -- whose forward a parallel plan replaced (sequence parallelism) keeps them apart.
  it("fuses the residual add into the second norm of each block", function()
    local function ops(model)
      C.tt_tape_clear()
      model(ids_tensor({ { 1, 2, 3, 4 } })):free()
      local count = tetra.nn.functional.tape_ops()
      C.tt_tape_clear()
      return count
    end
    local l = ops(llama.Model(TINY))
    expect(l["add_rms_norm.norm"]).to_be(2)
    expect(l["add_rms_norm.add"]).to_be(2)
    local g = ops(gpt2.Model({ vocab_size = 64, dim = 32, n_layers = 2, n_heads = 4,
                               ffn_hidden = 64, seq_len = 8, norm_eps = 1e-5 }))
    expect(g["add_layer_norm.norm"]).to_be(2)
    local m = llama.Model(TINY)
    for _, nm in ipairs(m:named_modules()) do
      local mod = nm[2]
      if mod.__name == "RMSNorm" then
        local class_forward = mod.forward
        mod.forward = function(self, x) return class_forward(self, x) end
      end
    end
    expect(ops(m)["add_rms_norm.norm"]).to_be(nil)
  end)

  it("frees intermediates: a forward leaves only the output and the tape alive", function()
    local m = llama.Model(TINY)
    local ids = ids_tensor({ { 1, 2, 3, 4 } })
    C.tt_tape_clear()   -- earlier tests ran forwards without backward
    tetra.no_grad(function() m(ids):free() end)
    collectgarbage("collect")
    local before = tetra.memory_stats().live_bytes
    tetra.no_grad(function() m(ids):free() end)
    expect(tetra.memory_stats().live_bytes).to_be(before)
    expect(C.tt_tape_size()).to_be(0)
  end)
end)
