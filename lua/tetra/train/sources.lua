-- tetra.train.sources: where a run's tokens come from.
--
-- A data source is any object with `:batch(step, batch_size, seq_len, split)` returning
-- int64 tokens (batch_size, seq_len + 1) for that step (split "train" or "val"); it must
-- depend only on (seed, step, split) so that every rank and every layout sees the same
-- global batch. sources.mock_data is one; tetra.data's pipeline (data.source) is the
-- other: it has `local_rows` set and returns this data-parallel rank's rows of the global
-- batch instead, reading and tokenizing only those.
local ffi = require("ffi")
local C = require("tetra.ffi").C
local T = require("tetra.tensor")
local errors = require("tetra.util.errors")
-- Found the same on every rank: printed once, as config errors are.
local config_error = require("tetra.config.registry").error

local sources = {}

local MockData = {}
MockData.__index = MockData

-- Uniform random tokens in [0, vocab_size) drawn from (seed, step, split), leaving the
-- engine's RNG stream (used for initialisation) where it was.
function sources.mock_data(vocab_size, seed)
  return setmetatable({ vocab_size = vocab_size, seed = seed or 0 }, MockData)
end

-- A well-mixed 64-bit seed for (seed, step, stream) (splitmix64 finaliser): nearby
-- inputs give unrelated generator states.
function sources.mix_seed(seed, step, stream)
  local x = ffi.new("uint64_t", seed) * 0x9E3779B97F4A7C15ULL + ffi.new("uint64_t", step)
  x = x * 0xBF58476D1CE4E5B9ULL + ffi.new("uint64_t", stream or 0)
  x = bit.bxor(x, bit.rshift(x, 30)) * 0xBF58476D1CE4E5B9ULL
  x = bit.bxor(x, bit.rshift(x, 27)) * 0x94D049BB133111EBULL
  return bit.bxor(x, bit.rshift(x, 31))
end

local shape2 = ffi.new("int64_t[2]")

function MockData:batch(step, batch_size, seq_len, split)
  local saved = C.tt_rng_state()
  C.tt_manual_seed(sources.mix_seed(self.seed, step, split == "val" and 1 or 0))
  shape2[0], shape2[1] = batch_size, seq_len + 1
  local status = C.tt_tensor_randint(shape2, 2, 0, self.vocab_size, C.TT_I64, T.pout)
  C.tt_rng_set_state(saved)
  return T.take(status, 2)
end

-- The smallest model.vocab_size the byte tokenizer's ids fit.
local BYTE_VOCAB = 256

-- The data source cfg.data asks for, and its tokenizer (nil for mock data):
--   data.mock = true   random tokens from data.seed / train.seed
--   otherwise          tetra.data's pipeline over data.input_path (paths, globs,
--                      s3://, JSONL / text / TFRecord, or prepared token shards) with
--                      data.tokenizer: byte (the default; one id per byte, needs
--                      model.vocab_size >= 256), a tokenizer file, or data.vocab_file
--                      (+ data.merges_file)
function sources.data_source(cfg)
  local d = cfg.data or {}
  local seed = d.seed or cfg.train.seed or 0
  if d.mock then return sources.mock_data(cfg.model.vocab_size, seed), nil end
  if (not d.input_path or d.input_path == "") and not d.datasets then
    config_error("no training data: set data.input_path (files, globs or s3:// paths) " ..
                 "or data.datasets, or data.mock=true for random tokens")
  end
  local offline = d.online_tokenization == false
  local bytes = (d.tokenizer == nil or d.tokenizer == "byte") and not d.vocab_file
  if bytes and not offline and cfg.model.vocab_size < BYTE_VOCAB then
    config_error("model.vocab_size (%d) must be at least %d for byte-level text " ..
                 "(data.tokenizer=byte: one id per byte)", cfg.model.vocab_size, BYTE_VOCAB)
  end
  local data = require("tetra.data")
  local dp = require("tetra.dist").init(cfg).dp
  -- GPT-2's layout: vocab.json with merges.txt beside it.
  if d.vocab_file and not d.merges_file and d.vocab_file:match("vocab%.json$") then
    local merges = d.vocab_file:gsub("vocab%.json$", "merges.txt")
    local f = io.open(merges, "r")
    if f then
      f:close()
      d.merges_file = merges
    end
  end
  -- The tokenizer and the training files open here, before any model is built, and a
  -- problem with them is one line.
  local ok, src, tok = pcall(function()
    -- Prepared shards need no tokenizer (one, if given, decodes samples).
    local function load(key, takes, ...)
      local ok, t = pcall(data.tokenizer, ...)
      if ok then return t end
      error(("%s: %s (it takes %s)"):format(key, tostring(t):gsub("^[^:]*%.lua:%d+: ", ""), takes), 0)
    end
    local tok = d.vocab_file and load("data.vocab_file", "a tokenizer.json, or a vocab.json " ..
                                      "with merges.txt beside it or in data.merges_file",
                                      d.vocab_file, d.merges_file)
                or (not bytes or not offline) and load("data.tokenizer", "byte, or a tokenizer.json " ..
                                                       "or .tiktoken file", d.tokenizer or "byte")
                or nil
    local src = data.source(cfg, dp)
    src:loader("train")
    -- The evaluation data too, when the run evaluates: a missing data.eval_path is found
    -- now, not after the first train.eval_every steps.
    if (cfg.train.eval_every or 0) > 0 then src:loader("val") end
    return src, tok
  end)
  if not ok then
    local msg = "data: " .. tostring(src):gsub("^[^:]*%.lua:%d+: ", "")
    if offline then
      msg = msg .. " (data.online_tokenization=false reads prepared token shards: make " ..
            "them with `tetra data prepare --tokenizer TOKENIZER --out DIR FILES`, then " ..
            "data.input_path=DIR/*.tok)"
    end
    errors.raise(msg)
  end
  return src, tok
end

return sources
