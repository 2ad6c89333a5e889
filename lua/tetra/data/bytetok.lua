-- tetra.data.bytetok: a byte-level tokenizer (token = byte, vocab 256) and a random-window
-- dataset over a text held in memory. The demo and the tests use it where a trained BPE
-- vocabulary is not available.
local ffi = require("ffi")
local C = require("tetra.ffi").C
local F = require("tetra.nn.functional")

local bytetok = { vocab_size = 256 }

-- String -> array of ids (0..255).
function bytetok.encode(text)
  local ids = {}
  for i = 1, #text do ids[i] = text:byte(i) end
  return ids
end

-- Array of ids (or an i32/i64 tensor) -> string.
function bytetok.decode(ids)
  local chars = {}
  if type(ids) == "table" then
    for i, id in ipairs(ids) do chars[i] = string.char(id % 256) end
  else
    local n = tonumber(C.tt_tensor_numel(ids))
    for i = 0, n - 1 do chars[i + 1] = string.char(C.tt_tensor_get(ids, i) % 256) end
  end
  return table.concat(chars)
end

-- The same as a tokenizer object, with the method calls tetra.data's BPE tokenizers take:
-- tok:encode(text), tok:decode(ids), tok:vocab_size().
bytetok.tokenizer = {
  encode = function(_, text) return bytetok.encode(text) end,
  decode = function(_, ids) return bytetok.decode(ids) end,
  vocab_size = function() return bytetok.vocab_size end,
}

-- -- Dataset ---------------------------------------------------------------------------

local Dataset = {}
Dataset.__index = Dataset

-- text: the corpus. opts: val_fraction (0.05; the tail of the text is held out), seed.
function bytetok.dataset(text, opts)
  opts = opts or {}
  local n = #text
  local bytes = ffi.new("uint8_t[?]", n)
  ffi.copy(bytes, text, n)
  local n_val = math.floor(n * (opts.val_fraction or 0.05))
  return setmetatable({ bytes = bytes, n = n, n_train = n - n_val, seed = opts.seed or 0,
                        vocab_size = 256 }, Dataset)
end

-- Tokens (batch_size, seq_len + 1) i64 for `step`: rows are windows at positions drawn
-- from (seed, step, split), so a run is reproducible and every data-parallel rank that
-- asks for the same step sees the same global batch. split: "train" (default) or "val".
function Dataset:batch(step, batch_size, seq_len, split)
  local lo, hi = 0, self.n_train
  if split == "val" then lo, hi = self.n_train, self.n end
  local span = hi - lo - (seq_len + 1)
  if span <= 0 then
    error(string.format("bytetok: the %s split has %d bytes, fewer than seq_len + 1 = %d",
      split or "train", hi - lo, seq_len + 1), 2)
  end
  math.randomseed(self.seed * 1000003 + step * 2 + (split == "val" and 1 or 0))
  local t = F.empty({ batch_size, seq_len + 1 }, C.TT_I64)
  local p = ffi.cast("int64_t *", C.tt_tensor_data(t))
  local bytes, w = self.bytes, seq_len + 1
  for b = 0, batch_size - 1 do
    local start = lo + math.random(0, span)
    for j = 0, seq_len do p[b * w + j] = bytes[start + j] end
  end
  return t
end

return bytetok
