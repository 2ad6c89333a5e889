-- Parity with PyTorch: the tiny Llama and GPT-2 of tools/torch_reference.py, loaded from
-- the committed fixtures (tests/fixtures/*_tiny*.safetensors), must give
--   the same initial loss          within 1e-5 relative
--   the same gradients             within 1e-4 relative norm error, parameter by parameter
--   the same 10 AdamW-step losses  within 1e-4 relative (grad clipping included)
-- Regenerate the fixtures with `/usr/bin/python3 tools/torch_reference.py`.
local ffi = require("ffi")
local tetra = require("tetra")
require("tetra.ffi").cdef_header("tetra_io.h")
local C = ffi.C
local F = tetra.nn.functional
local optim = tetra.optim

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local root = here .. "/../.."

-- -- Fixture access ----------------------------------------------------------------------

local function check(status)
  if status ~= 0 then error(ffi.string(C.tt_last_error()), 2) end
end

local function open_fixture(path)
  local pf = ffi.new("tt_safetensors*[1]")
  check(C.tt_safetensors_open(path, pf))
  local f = ffi.gc(pf[0], C.tt_safetensors_close)
  local fx = {}
  function fx.tensor(name)
    local out = ffi.new("tt_tensor*[1]")
    check(C.tt_safetensors_read(f, name, out))
    return tetra.tensor.wrap(out[0])
  end
  function fx.meta(key)
    local v = C.tt_safetensors_metadata_get(f, key)
    assert(v ~= nil, "fixture " .. path .. " has no metadata key " .. key)
    return ffi.string(v)
  end
  function fx.numbers(key)
    local list = {}
    for x in fx.meta(key):gmatch("[^,]+") do list[#list + 1] = tonumber(x) end
    return list
  end
  function fx.names()
    local list = {}
    for i = 0, C.tt_safetensors_count(f) - 1 do
      list[#list + 1] = ffi.string(C.tt_safetensors_name(f, i))
    end
    return list
  end
  return fx
end

-- model.* metadata -> the recipe's model config table.
local function model_config(fx, keys)
  local cfg = {}
  for _, k in ipairs(keys) do
    local v = fx.meta("model." .. k)
    if v == "true" or v == "false" then cfg[k] = (v == "true") else cfg[k] = tonumber(v) end
  end
  return cfg
end

local function values(t)
  local n = t:numel()
  local buf = ffi.new("double[?]", n)
  check(C.tt_tensor_to_f64(t, buf))
  return buf, n
end

-- ||a - b|| and ||b|| over all elements.
local function norms(a, b)
  local va, n = values(a)
  local vb, m = values(b)
  assert(n == m, "element counts differ")
  local num, den = 0.0, 0.0
  for i = 0, n - 1 do
    num = num + (va[i] - vb[i]) ^ 2
    den = den + vb[i] ^ 2
  end
  return math.sqrt(num), math.sqrt(den)
end

-- -- The three checks, for one model -----------------------------------------------------

local function parity(name, recipe_file, config_keys)
  describe(name, function()
    local fx = open_fixture(root .. "/tests/fixtures/" .. name .. ".safetensors")
    local grads = open_fixture(root .. "/tests/fixtures/" .. name .. "_grads.safetensors")
    local recipe = dofile(root .. "/recipes/" .. recipe_file)
    local cfg = model_config(fx, config_keys)
    local ids, targets = fx.tensor("batch.input_ids"), fx.tensor("batch.targets")

    local function fresh_model()
      local model = recipe.Model(cfg)
      local sd = {}
      for _, np in ipairs(model:named_parameters()) do sd[np[1]] = fx.tensor(np[1]) end
      model:load_state_dict(sd)
      return model
    end

    local function loss_of(model)
      local logits = model(ids)
      local loss = F.cross_entropy(logits, targets)
      logits:free()
      return loss
    end

    it("has PyTorch's parameter names, in registration order", function()
      local names = {}
      for _, np in ipairs(fresh_model():named_parameters()) do names[#names + 1] = np[1] end
      local expected = {}
      for n in fx.meta("expected.params"):gmatch("[^,]+") do expected[#expected + 1] = n end
      expect(names).to_equal(expected)
    end)

    it("matches the initial loss and every gradient", function()
      local model = fresh_model()
      local loss = loss_of(model)
      expect(loss:item()).to_be_close(tonumber(fx.meta("expected.loss")), 1e-5, 0)
      loss:backward()
      -- A gradient that is zero in exact arithmetic (GPT-2's key bias: adding the same
      -- q.b to every score of a row leaves the softmax unchanged) is rounding noise in
      -- both implementations; it is held to 1e-4 of the global gradient norm instead.
      local global = tonumber(fx.meta("expected.grad_norms"):match("^[^,]+"))
      for _, np in ipairs(model:named_parameters()) do
        local g = np[2].grad
        expect(g).never.to_be_nil()
        local diff, ref = norms(g, grads.tensor(np[1]))
        local scale = ref > 1e-6 * global and ref or global
        if diff > 1e-4 * scale then
          error(string.format("grad of %s: norm error %.3g, reference norm %.3g (> 1e-4)",
            np[1], diff, ref))
        end
      end
    end)

    it("matches 10 AdamW steps with gradient clipping", function()
      local model = fresh_model()
      local opt = optim.AdamW(model:named_parameters(), {
        lr = tonumber(fx.meta("optim.lr")), beta1 = tonumber(fx.meta("optim.beta1")),
        beta2 = tonumber(fx.meta("optim.beta2")), eps = tonumber(fx.meta("optim.eps")),
        weight_decay = tonumber(fx.meta("optim.weight_decay")) })
      local max_norm = tonumber(fx.meta("optim.max_grad_norm"))
      local losses, norms = {}, {}
      for i = 1, tonumber(fx.meta("optim.steps")) do
        local loss = loss_of(model)
        losses[i] = loss:item()
        loss:backward()
        norms[i] = opt:clip_grad_norm(max_norm)
        opt:step()
        opt:zero_grad()
      end
      expect(losses).to_be_close(fx.numbers("expected.losses"), 1e-4, 0)
      expect(norms).to_be_close(fx.numbers("expected.grad_norms"), 1e-4, 0)
    end)
  end)
end

parity("llama_tiny", "llama.lua", { "vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads",
                                    "ffn_hidden", "seq_len", "norm_eps", "rope_theta",
                                    "tie_embeddings" })
parity("gpt2_tiny", "gpt2.lua", { "vocab_size", "dim", "n_layers", "n_heads", "ffn_hidden",
                                  "seq_len", "norm_eps" })
