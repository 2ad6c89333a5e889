-- tetra.data: the C data pipeline (engine/data/) as Lua objects.
--
--   local loader = tetra.data.loader(cfg, mesh)   -- this DP rank's rows of each global batch
--   local inputs, targets = loader:next_batch()   -- i64 (local_batch, seq_len) tensors
--   local blob = loader:state(); loader:load_state(blob)   -- exact resume
--   loader:stats()   -- { tokens_per_s, queue_depth, wait_s, total_wait_s, tokens, ... }
--
--   local src = tetra.data.source(cfg, mesh.dp) -- for tetra.train: src:batch(step, B, T,
--                                               -- split), this DP rank's rows
--   local ids = tetra.data.tokenizer(path):encode("text")
--
-- Config keys (cfg.data): input_path (path, glob, comma list or a Lua list; token shards
-- when online_tokenization is false), or datasets =
-- { {path = ..., weight = ..., type = "jsonl"|"text"|"tfrecord"|"tokens", text_field = ...}, ... };
-- paths may be s3://bucket/prefix/*.jsonl (s3_endpoint, s3_region, s3_retries,
-- s3_timeout_s, s3_block_mb over the AWS_* environment variables); prefetch (steps);
-- tokenizer ("byte", the default: one id per byte; tokenizer.json or .tiktoken) or
-- vocab_file + merges_file; text_field
-- ("text"); seq_len (default model.seq_len); num_streams; shuffle_buffer_size; seed
-- (default train.seed); num_workers; queue_depth; max_bad_lines; eos_id; eval_path or
-- eval_fraction (the held-out evaluation data).
local ffi = require("ffi")
local tffi = require("tetra.ffi")
tffi.cdef_header("tetra_data.h")
local C = tffi.C
local check = tffi.check
local tensor = require("tetra.tensor")
local errors = require("tetra.util.errors")

local data = {}

local TYPES = { jsonl = C.TT_DATA_JSONL, text = C.TT_DATA_TEXT, tokens = C.TT_DATA_TOKENS,
                tfrecord = C.TT_DATA_TFRECORD }

-- The keys of a data.datasets entry (input_path: path's other name).
local DATASET_KEYS = { path = true, input_path = true, weight = true, type = true,
                       text_field = true }

local function paths_string(p, key)
  if type(p) == "table" then return table.concat(p, ",") end
  if type(p) ~= "string" or p == "" then
    error(key .. ": expected a path, a glob or a list of them", 3)
  end
  return p
end

-- The fraction of each training source held out for evaluation: with train.eval_every
-- and no data.eval_path, the end of every source (data.eval_fraction) is read by the
-- evaluation loader and never by the training one. nil when nothing is held out.
function data.holdout(cfg)
  local d, t = cfg.data or {}, cfg.train or {}
  if (t.eval_every or 0) > 0 and not d.eval_path and not d.mock and (d.eval_fraction or 0) > 0 then
    return d.eval_fraction
  end
end

-- Builds a tt_data_config; `keep` holds the Lua strings and arrays it points into.
-- opts: input (paths instead of the training sources), range_lo / range_hi (the part
-- of each source read), num_streams.
local function build_config(cfg, dp_rank, dp_size, opts)
  opts = opts or {}
  local input_override = opts.input
  local d = cfg.data or {}
  local keep = {}
  local list = {}
  if input_override then
    list[1] = { path = input_override, weight = 1 }
  elseif d.datasets then
    list = d.datasets
  elseif d.input_path then
    list[1] = { path = d.input_path, weight = 1 }
  else
    error("data: set data.input_path or data.datasets", 3)
  end
  local srcs = ffi.new("tt_data_source[?]", #list)
  keep[#keep + 1] = srcs
  for i, ds in ipairs(list) do
    local s = srcs[i - 1]
    if type(ds) ~= "table" or #ds > 0 then
      error(("data.datasets[%d]: expected a mapping like {path: FILES, weight: 2}, got %s")
            :format(i, type(ds) == "table" and "a list" or tostring(ds)), 3)
    end
    for k in pairs(ds) do
      if not DATASET_KEYS[k] then
        error(("data.datasets[%d]: unknown key '%s' (keys: path, weight, type, text_field)")
              :format(i, tostring(k)), 3)
      end
    end
    if ds.weight ~= nil and not (type(ds.weight) == "number" and ds.weight > 0 and
                                 ds.weight < math.huge) then
      error(("data.datasets[%d].weight: expected a number > 0, got %s")
            :format(i, tostring(ds.weight)), 3)
    end
    local p = paths_string(ds.path or ds.input_path, ("data.datasets[%d].path"):format(i))
    keep[#keep + 1] = p
    s.paths = p
    s.weight = ds.weight or 1
    if ds.type ~= nil and TYPES[ds.type] == nil then
      error(("data.datasets[%d].type: %s (expected jsonl, text, tfrecord or tokens)"):format(i, tostring(ds.type)), 3)
    end
    -- data.online_tokenization = false: data.input_path names prepared token shards
    -- (tetra data prepare), not text.
    local kind = ds.type or (not d.datasets and d.online_tokenization == false and "tokens")
    s.type = kind and TYPES[kind] or -1
    local field = ds.text_field or d.text_field
    if field then
      keep[#keep + 1] = field
      s.text_field = field
    end
  end
  -- s3:// paths: the data.s3_* keys over the AWS environment variables.
  C.tt_s3_configure(d.s3_endpoint, d.s3_region, d.s3_retries or -1, d.s3_timeout_s or 0,
                    d.s3_block_mb and math.floor(d.s3_block_mb * 1048576) or 0)
  local c = ffi.new("tt_data_config")
  keep[#keep + 1] = c
  c.sources = srcs
  c.n_sources = #list
  local function str(v)
    if v == nil then return nil end
    keep[#keep + 1] = v
    return v
  end
  if d.vocab_file and not d.merges_file then   -- a whole tokenizer (tokenizer.json) file
    c.tokenizer = str(d.vocab_file)
  else
    -- data.tokenizer: byte (the default) is the byte tokenizer (tt_bpe_bytes), except
    -- beside vocab_file + merges_file or over prepared token shards (their own EOS).
    local tok = d.tokenizer or "byte"
    local bytes_unused = d.vocab_file or d.online_tokenization == false
    c.tokenizer = (tok ~= "byte" or not bytes_unused) and str(tok) or nil
    c.vocab_file = str(d.vocab_file)
    c.merges_file = str(d.merges_file)
  end
  c.seq_len = d.seq_len or (cfg.model and cfg.model.seq_len) or error("data: seq_len unknown (model.seq_len)", 3)
  c.global_batch = (cfg.train and cfg.train.batch_size) or d.batch_size or error("data: train.batch_size unknown", 3)
  c.dp_rank = dp_rank
  c.dp_size = dp_size
  c.num_streams = opts.num_streams or d.num_streams or 0
  c.range_lo, c.range_hi = opts.range_lo or 0, opts.range_hi or 0
  c.shuffle_buffer = d.shuffle_buffer_size or 0
  c.seed = d.seed or (cfg.train and cfg.train.seed) or 1234
  c.num_workers = d.num_workers or 0
  c.queue_depth = d.queue_depth or 0
  c.prefetch_steps = d.prefetch or 0
  c.max_bad_lines = d.max_bad_lines or -1
  c.eos_id = d.eos_id or -1
  return c, keep
end

-- -- Loader ------------------------------------------------------------------------------

local Loader = {}
Loader.__index = Loader

local box = ffi.new("tt_data_loader*[1]")
local tbox = ffi.new("tt_tensor*[2]")

-- The key that names source i (1-based) of a loader built with `opts`.
local function source_key(cfg, opts, i)
  if opts and opts.input then return "data.eval_path" end
  if (cfg.data or {}).datasets then return ("data.datasets[%d]"):format(i) end
  return "data.input_path"
end

local function new_loader(cfg, dp_rank, dp_size, opts)
  local c = build_config(cfg, dp_rank, dp_size, opts)
  if C.tt_data_loader_new(c, box) ~= 0 then
    -- The engine numbers its sources; the user wrote keys.
    local msg = ffi.string(C.tt_last_error())
    local i, rest = msg:match("^data source (%d+): (.*)$")
    if i then msg = source_key(cfg, opts, tonumber(i)) .. ": " .. rest end
    error(msg, 3)
  end
  local self = setmetatable({}, Loader)
  self.ptr = ffi.gc(box[0], C.tt_data_loader_free)
  self.seq_len = tonumber(c.seq_len)
  self.global_batch = tonumber(c.global_batch)
  self.local_batch = tonumber(C.tt_data_loader_local_batch(self.ptr))
  return self
end

-- The loader of this DP rank (mesh.dp: the data-parallel group; nil means one rank).
function data.loader(cfg, mesh)
  local g = mesh and mesh.dp
  local f = data.holdout(cfg)
  return new_loader(cfg, g and g.rank or 0, g and g.size or 1, f and { range_hi = 1 - f })
end

-- What the loader's threads find wrong while reading (a JSONL line without the text
-- field, a source with fewer documents than streams, an S3 read that ran out of retries,
-- a saved state that is not this data's) is the data's problem, not Tetra's: one line.
local function check_data(status)
  if status ~= 0 then errors.raise("data: %s", ffi.string(C.tt_last_error())) end
end

-- inputs, targets: i64 tensors (local_batch, seq_len); targets are inputs shifted by one.
function Loader:next_batch()
  check_data(C.tt_data_loader_next_tensors(self.ptr, tbox, tbox + 1))
  return tensor.wrap(tbox[0]), tensor.wrap(tbox[1])
end

-- The loader state as a Lua string (binary); several ranks' strings concatenated restore
-- on any DP size.
function Loader:state()
  local p = ffi.new("const uint8_t*[1]")
  local n = ffi.new("size_t[1]")
  check(C.tt_data_loader_state(self.ptr, p, n), 2)
  return ffi.string(p[0], n[0])
end

function Loader:load_state(s)
  check_data(C.tt_data_loader_load_state(self.ptr, ffi.cast("const uint8_t*", s), #s))
end

function Loader:stats()
  local st = ffi.new("tt_data_stats")
  check(C.tt_data_loader_stats(self.ptr, st), 2)
  return {
    tokens_per_s = st.tokens_per_s, wait_s = st.wait_s, total_wait_s = st.total_wait_s,
    queue_depth = tonumber(st.queue_depth), tokens = tonumber(st.tokens),
    batches = tonumber(st.batches), bad_lines = tonumber(st.bad_lines), epochs = tonumber(st.epochs),
  }
end

function Loader:free()
  if self.ptr ~= nil then
    C.tt_data_loader_free(ffi.gc(self.ptr, nil))
    self.ptr = nil
  end
end

-- -- Data source for tetra.train -----------------------------------------------------------

-- An object with :batch(step, batch_size, seq_len, split) -> i64 (batch_size / dp,
-- seq_len + 1): rows [r B / dp, (r + 1) B / dp) of the global batch for data-parallel rank
-- r of `dp_group` (nil: one rank, the whole batch), as tetra.train expects from a source
-- with local_rows set. The loader runs (and tokenizes) only the streams that feed those
-- rows. Steps must come in order (1, 2, ...; after load_state, the step after the saved
-- one). Split "val" reads data.eval_path, or the held-out ends (data.holdout).
local Source = {}
Source.__index = Source

function data.source(cfg, dp_group)
  return setmetatable({ cfg = cfg, loaders = {}, next_step = {}, local_rows = true,
                        dp_rank = dp_group and dp_group.rank or 0,
                        dp_size = dp_group and dp_group.size or 1 }, Source)
end

function Source:loader(split)
  local l = self.loaders[split]
  if not l then
    local d = self.cfg.data or {}
    local f = data.holdout(self.cfg)
    local opts
    if split == "val" then
      if d.eval_path then
        opts = { input = d.eval_path }
      elseif f then   -- one stream: the held-out ends are small
        opts = { range_lo = 1 - f, range_hi = 1, num_streams = 1 }
      else
        error("data: evaluation needs data.eval_path, or data.eval_fraction > 0 to hold out the end of each training source", 3)
      end
    elseif f then
      opts = { range_hi = 1 - f }
    end
    l = new_loader(self.cfg, self.dp_rank, self.dp_size, opts)
    self.loaders[split] = l
    self.next_step[split] = 1
  end
  return l
end

function Source:batch(step, batch_size, seq_len, split)
  split = split or "train"
  local l = self:loader(split)
  local rows = batch_size / self.dp_size
  if batch_size ~= l.global_batch or seq_len ~= l.seq_len then
    error(("data: batch(%d, %d) but the loader was made for batch %d, seq_len %d"):format(
      batch_size, seq_len, l.global_batch, l.seq_len), 2)
  end
  if split == "train" and step ~= self.next_step[split] then
    error(("data: step %d requested, the loader is at step %d (restore its state to resume)"):format(
      step, self.next_step[split]), 2)
  end
  self.next_step[split] = self.next_step[split] + 1
  local x, y = l:next_batch()
  local tokens = tensor.wrap((function()
    local out = ffi.new("tt_tensor*[1]")
    local shape = ffi.new("int64_t[2]", rows, seq_len + 1)
    check(C.tt_tensor_empty(shape, 2, C.TT_I64, C.TT_CPU, out), 3)
    return out[0]
  end)())
  local dst = ffi.cast("int64_t*", C.tt_tensor_data(tokens))
  local xs = ffi.cast("const int64_t*", C.tt_tensor_data(x))
  local ys = ffi.cast("const int64_t*", C.tt_tensor_data(y))
  for r = 0, rows - 1 do
    ffi.copy(dst + r * (seq_len + 1), xs + r * seq_len, seq_len * 8)
    dst[r * (seq_len + 1) + seq_len] = ys[r * seq_len + seq_len - 1]
  end
  x:free()
  y:free()
  return tokens
end

-- { step, loader = this rank's loader state }. The states of every data-parallel rank,
-- concatenated, restore a loader of any data-parallel size.
function Source:state()
  return { step = self.next_step.train, loader = self:loader("train"):state() }
end

function Source:load_state(s)
  self:loader("train"):load_state(s.loader)
  self.next_step.train = s.step
end

function Source:stats()
  return self:loader("train"):stats()
end

-- -- Tokenizer -----------------------------------------------------------------------------

local Tokenizer = {}
Tokenizer.__index = Tokenizer

-- Loads tokenizer.json / .tiktoken (one argument; "byte": the byte tokenizer) or
-- vocab.json + merges.txt (two).
function data.tokenizer(path, merges)
  local b = ffi.new("tt_bpe*[1]")
  if merges then check(C.tt_bpe_load_vocab_merges(path, merges, b), 2)
  else check(C.tt_bpe_load(path, b), 2) end
  return setmetatable({ ptr = ffi.gc(b[0], C.tt_bpe_free) }, Tokenizer)
end

-- Ids of `text` as a Lua list (special tokens recognised when allow_special is true).
function Tokenizer:encode(text, allow_special)
  local n = ffi.new("size_t[1]")
  local cap = #text + 16
  local ids = ffi.new("int32_t[?]", cap)
  check(C.tt_bpe_encode(self.ptr, text, #text, allow_special and 1 or 0, ids, cap, n), 2)
  local out = {}
  for i = 0, tonumber(n[0]) - 1 do out[i + 1] = ids[i] end
  return out
end

function Tokenizer:decode(ids)
  local n = #ids
  local arr = ffi.new("int32_t[?]", math.max(n, 1))
  for i = 1, n do arr[i - 1] = ids[i] end
  local need = ffi.new("size_t[1]")
  check(C.tt_bpe_decode(self.ptr, arr, n, nil, 0, need), 2)
  local buf = ffi.new("char[?]", math.max(tonumber(need[0]), 1))
  check(C.tt_bpe_decode(self.ptr, arr, n, buf, need[0], need), 2)
  return ffi.string(buf, need[0])
end

function Tokenizer:vocab_size() return tonumber(C.tt_bpe_vocab_size(self.ptr)) end
function Tokenizer:eos_id() return tonumber(C.tt_bpe_eos_id(self.ptr)) end

-- Trains a vocabulary (see `tetra tokenizer train`).
function data.train_tokenizer(files, vocab_size, out_dir, opts)
  opts = opts or {}
  local arr = ffi.new("const char*[?]", #files)
  for i, f in ipairs(files) do arr[i - 1] = f end
  check(C.tt_bpe_train(arr, #files, vocab_size, out_dir, nil, opts.threads or 2, opts.verbose and 1 or 0), 2)
end

return data
