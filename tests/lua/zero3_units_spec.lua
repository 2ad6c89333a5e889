-- ZeRO-3's units (tetra.parallel.data.units): the parameters a block gathers. The tiny
-- Llama (embedding, 2 layers of 9 parameters, final norm, head) gives unit 0 to the
-- embedding, 1 and 2 to the layers, 3 to the norm and head; GPT-2 (token and position
-- embeddings, 3 blocks, final norm, tied head) the same shape. A plan without a blocks
-- list, and parameters of blocks out of order, are refused with one line naming the fix.
local tetra = require("tetra")
local data = require("tetra.parallel.data")

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")
local gpt2 = dofile(here .. "/../../recipes/gpt2.lua")

local function entries(model)
  local out = {}
  for _, np in ipairs(model:named_parameters()) do
    out[#out + 1] = { name = np[1], tensor = np[2] }
  end
  return out
end

local function counts(unit_of)
  local n = {}
  for _, u in ipairs(unit_of) do n[u + 1] = (n[u + 1] or 0) + 1 end
  return n
end

describe("data.units", function()
  it("gives the embedding, each block and the head a unit of their own, in order", function()
    tetra.manual_seed(1)
    local model = tiny.Model(tiny.defaults.model)
    local unit_of, blocks = data.units(model, tiny.plan, entries(model))
    expect(counts(unit_of)).to_equal({ 1, 9, 9, 2 })
    expect(#blocks).to_be(2)
    expect(blocks[1].unit).to_be(1)
    expect(blocks[2].unit).to_be(2)
    expect(blocks[1].module == model.layers["0"]).to_be(true)
  end)

  it("does the same for GPT-2's blocks", function()
    tetra.manual_seed(1)
    local m = {}
    for k, v in pairs(gpt2.defaults.model) do m[k] = v end
    m.vocab_size, m.dim, m.n_layers, m.n_heads, m.ffn_hidden, m.seq_len = 256, 64, 3, 4, 128, 32
    local model = gpt2.Model(m)
    local unit_of, blocks = data.units(model, gpt2.plan, entries(model))
    local n = counts(unit_of)
    expect(#n).to_be(5)
    expect(#blocks).to_be(3)
    expect(n[2]).to_be(n[3])
    expect(n[3]).to_be(n[4])
  end)

  it("refuses a plan without blocks and blocks out of order", function()
    tetra.manual_seed(1)
    local model = tiny.Model(tiny.defaults.model)
    local unit_of, err = data.units(model, {}, entries(model))
    expect(unit_of).to_be(nil)
    expect(err).to_match("plan names no blocks list %(plan.pipeline.blocks")
    local list = entries(model)
    list[2], list[#list - 2] = list[#list - 2], list[2]   -- a layer 1 weight before layer 0's
    unit_of, err = data.units(model, tiny.plan, list)
    expect(unit_of).to_be(nil)
    expect(err).to_match("^parallel.zero_stage = 3: parameter .* of block 1 comes after")
  end)
end)
