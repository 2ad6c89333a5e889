-- tetra.checkpoint.hf: Hugging Face model folders <-> Tetra checkpoints, for every model
-- family whose folder has an hf.lua (recipes/llama/hf.lua: LlamaForCausalLM,
-- recipes/gpt2/hf.lua: GPT2LMHeadModel, recipes/qwen2/hf.lua: Qwen2ForCausalLM).
--
--   hf.export(checkpoint_dir, out_dir, opts)   -- config.json + model.safetensors (or
--                                              -- model-0000K-of-0000N.safetensors and
--                                              -- model.safetensors.index.json)
--   hf.import(hf_dir, out_dir, opts)           -- a weights-only Tetra checkpoint
--   hf.model_config(source)                    -- model.* keys of "hf:DIR" or a checkpoint
--   hf.init_weights(model, source)             -- copies its weights into a built model
--
-- A Hugging Face folder is read as data only: config.json (JSON) and safetensors files
-- (engine/io/safetensors.c checks every header against the file's size); pickled
-- pytorch_model.bin files, which can run code, are never opened. Every size comes from
-- config.json and must agree with each tensor's header before anything is read.
--
-- A family's hf.lua gives its model_type, config.json keys (from_config, to_config) and
-- its mapping, a list of rules: one Hugging Face tensor made from one or more Tetra
-- parameters by a kind of copy, which this file carries out:
--   copy   the same matrix under another name
--   t      transposed (GPT-2's Conv1D layers store weights as (in, out))
--   qkv    GPT-2's fused c_attn: the rows of wq, wk, wv stacked, then transposed
--   cat    GPT-2's fused c_attn bias: the three biases end to end
--   rope   Llama's q_proj / k_proj (weights or biases): a copy, since Tetra's RoPE
--          (engine/ops/rope.c, rotate-half: dimension i pairs with i + Dh/2) is Hugging
--          Face's; with rope_layout "meta" the rows of each head are in Meta's
--          interleaved order (i pairs with i + 1) in the Hugging Face files and are
--          permuted on the way
local ffi = require("ffi")
local T = require("tetra.tensor")
local st = require("tetra.io")
local host = require("tetra.host")
local checkpoint = require("tetra.checkpoint")
local models = require("tetra.models")
local fs = require("tetra.util.fs")
local json = require("tetra.util.json")

local M = {}

local fail, exists = require("tetra.util.errors").raise, fs.exists

pcall(ffi.cdef, "int memcmp(const void *a, const void *b, size_t n);")

local read_text = fs.read_file   -- a whole file, or nil

local function shape_text(s) return "[" .. table.concat(s, ", ") .. "]" end

local function numel(shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end

-- -- config.json -----------------------------------------------------------------------

-- The families that convert: { family name = its hf.lua }, and their model types.
local function hf_families()
  local out, types = {}, {}
  for _, name in ipairs(models.names()) do
    local h = models.hf(name)
    if h then
      out[name] = h
      types[#types + 1] = string.format("%s (%s)", h.model_type, h.architecture)
    end
  end
  return out, types
end

-- Family `name`'s hf.lua; one line if it has none.
local function family_hf(name)
  local h = models.hf(name)
  if not h then fail("model family '%s' has no Hugging Face mapping (recipes/%s/hf.lua)", name, name) end
  return h
end

-- Reads dir/config.json into Tetra's model.* keys (with family), refusing what Tetra's
-- models do not compute.
local function hf_model_config(dir)
  local path = dir .. "/config.json"
  local text = read_text(path)
  if not text then fail("%s is missing (a Hugging Face model folder holds config.json)", path) end
  local ok, c = pcall(json.decode, text)
  if not ok or type(c) ~= "table" then
    fail("%s is not a JSON object (%s)", path, ok and "not an object" or tostring(c))
  end
  local get = {}
  function get.fail(fmt, ...) fail("%s: " .. fmt, path, ...) end
  function get.int(key, default)
    local v = c[key]
    if v == nil or v == json.null then v = default end
    if type(v) ~= "number" or v % 1 ~= 0 or v < 1 or v >= 2^31 then
      get.fail("%s must be a positive integer below 2^31, got %s", key, tostring(v))
    end
    return v
  end
  function get.num(key, default, max)
    local v = c[key]
    if v == nil then v = default end
    if type(v) ~= "number" or not (v > 0 and v < max) then
      get.fail("%s must be a number in (0, %g), got %s", key, max, tostring(v))
    end
    return v
  end
  function get.refuse(key, bad, why)
    if c[key] ~= nil and c[key] ~= json.null and bad(c[key]) then
      get.fail("%s = %s is not supported: %s", key, tostring(c[key]), why)
    end
  end
  local families, types = hf_families()
  for _, name in ipairs(models.names()) do
    local h = families[name]
    if h and h.model_type == c.model_type then
      local m = h.from_config(c, get)
      m.family = name
      return m
    end
  end
  fail("%s: model_type %s: tetra converts %s", path, tostring(c.model_type),
       table.concat(types, ", "))
end

-- -- The mapping -----------------------------------------------------------------------

-- The rules of model m: { hf = name, kind = ..., tetra = { names }, shapes = { Tetra
-- shapes }, heads = (rope) } in Hugging Face's order. names: the tensor names of the
-- folder being read (a family may accept more than one naming), nil when writing.
local function rules_for(m, names)
  local R = {}
  family_hf(m.family).rules(m, function(hf, kind, tetra, shapes, heads)
    R[#R + 1] = { hf = hf, kind = kind, tetra = tetra, shapes = shapes, heads = heads }
  end, names)
  return R
end

-- The Hugging Face shape of rule r.
local function hf_shape(r)
  local s = r.shapes
  if r.kind == "t" then return { s[1][2], s[1][1] } end
  if r.kind == "qkv" then return { s[1][2], s[1][1] + s[2][1] + s[3][1] } end
  if r.kind == "cat" then return { s[1][1] + s[2][1] + s[3][1] } end
  return s[1]
end

local function transposed(t) return t:transpose(0, 1):contiguous() end

-- The rows of each head of w (heads x hd, in), or of a bias (heads x hd), reordered:
-- "to_meta" takes rotate-half order (pairs i, i + hd/2) to interleaved (pairs 2i, 2i + 1);
-- otherwise the reverse.
local function permute_rope(w, heads, to_meta)
  local shape = w:shape()
  local rows, cols = shape[1], shape[2] or 1
  local hd = rows / heads
  local v = to_meta and w:view(heads, 2, hd / 2, cols) or w:view(heads, hd / 2, 2, cols)
  return v:transpose(1, 2):contiguous():view(shape)
end

-- Stacks the rows of 1-D or 2-D tensors.
local function stack_rows(list)
  local rows = 0
  for _, t in ipairs(list) do rows = rows + t:size(0) end
  local shape = list[1]:shape()
  shape[1] = rows
  local out, at = T.empty(shape), 0
  for _, t in ipairs(list) do
    out:narrow(0, at, t:size(0)):copy_(t)
    at = at + t:size(0)
  end
  return out
end

-- The Hugging Face tensor of rule r from its Tetra tensors (in r.tetra's order).
local function to_hf(r, ts, rope_layout)
  if r.kind == "t" then return transposed(ts[1]) end
  if r.kind == "qkv" then return transposed(stack_rows(ts)) end
  if r.kind == "cat" then return stack_rows(ts) end
  if r.kind == "rope" and rope_layout == "meta" then return permute_rope(ts[1], r.heads, true) end
  return ts[1]
end

-- The Tetra tensors of rule r from its Hugging Face tensor.
local function from_hf(r, t, rope_layout)
  if r.kind == "t" then return { transposed(t) } end
  if r.kind == "qkv" or r.kind == "cat" then
    local rows = r.kind == "qkv" and transposed(t) or t
    local out, at = {}, 0
    for i, s in ipairs(r.shapes) do
      out[i] = rows:narrow(0, at, s[1]):contiguous()
      at = at + s[1]
    end
    return out
  end
  if r.kind == "rope" and rope_layout == "meta" then return { permute_rope(t, r.heads, false) } end
  return { t }
end

local function check_rope_layout(opts)
  local l = opts.rope_layout or "hf"
  if l ~= "hf" and l ~= "meta" then
    fail("--rope-layout must be hf (rotate-half, what transformers computes) or meta " ..
         "(interleaved pairs, Meta's original checkpoints), got '%s'", tostring(l))
  end
  return l
end

-- -- Reading a Hugging Face folder -----------------------------------------------------

-- Non-parameter buffers older transformers versions saved (the family's hf.lua lists
-- their patterns): recomputed, never read.
local function is_buffer(h, name)
  for _, pattern in ipairs(h.buffers or {}) do
    if name:match(pattern) then return true end
  end
  return false
end

local INDEX = "model.safetensors.index.json"

-- Where each tensor of folder dir is: { NAME = file name }, and the open files { file =
-- handle }. model.safetensors, or the files model.safetensors.index.json names.
local function hf_files(dir)
  local files, where = {}, {}
  local function open(file)
    local path = dir .. "/" .. file
    if not exists(path) then fail("%s is missing (%s names it)", path, INDEX) end
    local ok, f = pcall(st.open, path)
    if not ok then fail("%s", tostring(f)) end
    files[file] = f
    return f
  end
  if exists(dir .. "/model.safetensors") then
    for _, name in ipairs(open("model.safetensors"):names()) do where[name] = "model.safetensors" end
    return files, where, "model.safetensors"
  end
  local path = dir .. "/" .. INDEX
  local text = read_text(path)
  if not text then
    fail("%s has no model.safetensors or %s (pytorch_model.bin files are pickles, which " ..
         "can run code: tetra reads safetensors only)", dir, INDEX)
  end
  local ok, idx = pcall(json.decode, text)
  if not ok or type(idx) ~= "table" or type(idx.weight_map) ~= "table" then
    fail("%s is corrupt (%s)", path, ok and "no weight_map object" or tostring(idx))
  end
  local names = {}
  for name, file in pairs(idx.weight_map) do
    if type(name) ~= "string" then fail("%s: weight_map must be an object of names", path) end
    if type(file) ~= "string" or not file:match("^[%w_][%w_.%-]*%.safetensors$") or
       file:find("..", 1, true) then
      fail("%s: tensor '%s' maps to %s, which is not a .safetensors file in the folder " ..
           "(no paths, no ..)", path, tostring(name), tostring(file))
    end
    names[#names + 1] = name
  end
  table.sort(names)
  for _, name in ipairs(names) do
    local file = idx.weight_map[name]
    local f = files[file] or open(file)
    if not f:has(name) then
      fail("%s maps tensor '%s' to %s, which does not hold it", path, name, file)
    end
    where[name] = file
  end
  for file, f in pairs(files) do
    for _, name in ipairs(f:names()) do
      if where[name] ~= file then
        fail("%s/%s: tensor '%s' is not mapped to this file by %s", dir, file, name, INDEX)
      end
    end
  end
  return files, where, INDEX
end

local FLOAT_DTYPES = { f32 = true, bf16 = true, f16 = true }

-- Opens Hugging Face folder dir: its model keys, its rules, and a reader whose
-- read(rule) returns the rule's Hugging Face tensor as f32, checked (dtype, shape,
-- finite). Every tensor's header is checked against config.json here, before any data
-- is read; a missing or unknown tensor is an error.
local function open_hf(dir)
  if not host.is_dir(dir) then fail("%s is not a directory (a Hugging Face model folder)", dir) end
  local m = hf_model_config(dir)
  local h = family_hf(m.family)
  local files, where, listing = hf_files(dir)
  local rules = rules_for(m, where)
  local wanted = {}
  for _, r in ipairs(rules) do wanted[r.hf] = r end
  local head = h.head
  local embed = rules[1].hf
  local function info(name)
    local f = files[where[name]]
    return f:info(name), dir .. "/" .. where[name]
  end
  for _, r in ipairs(rules) do
    if not where[r.hf] then
      fail("%s/%s: tensor '%s' is missing (config.json's %s model needs it)", dir, listing,
           r.hf, m.family)
    end
    local i, path = info(r.hf)
    if not FLOAT_DTYPES[i.dtype] then
      local f = files[where[r.hf]]
      local _, err = pcall(f.read, f, r.hf)   -- refused before any data is read
      fail("%s: tensor '%s' has dtype %s: expected F32, BF16 or F16", path, r.hf,
           i.dtype and i.dtype:upper() or tostring(err):match("dtype (%w+)") or "unknown")
    end
    local want = hf_shape(r)
    if shape_text(i.shape) ~= shape_text(want) then
      fail("%s: tensor '%s' has shape %s but config.json implies %s", path, r.hf,
           shape_text(i.shape), shape_text(want))
    end
  end
  local extra_head = false
  local names = {}
  for name in pairs(where) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    if not wanted[name] and not is_buffer(h, name) then
      if name == head and m.tie_embeddings and
         shape_text(info(head).shape) == shape_text(info(embed).shape) and
         FLOAT_DTYPES[info(head).dtype] then
        extra_head = true   -- a tied head saved anyway: it must equal the embedding
      else
        fail("%s/%s: tensor '%s' is not part of a %s model as config.json describes it",
             dir, where[name], name, m.family)
      end
    end
  end
  local reader = { model = m, rules = rules, dir = dir }
  function reader.read_name(name)   -- a tensor checked above (dtype, shape)
    local f, path = files[where[name]], dir .. "/" .. where[name]
    local dt = f:info(name).dtype
    local ok, t = pcall(f.read, f, name)
    if not ok then fail("%s: tensor '%s': %s", path, name, tostring(t)) end
    if dt ~= "f32" then t = t:float() end
    local s = T.sum(t):item()
    if s ~= s or s == math.huge or s == -math.huge then
      fail("%s: tensor '%s' holds NaN or Inf values", path, name)
    end
    return t
  end
  function reader.read(r) return reader.read_name(r.hf) end
  function reader.file_of(name) return where[name] end
  function reader.check_tied_head()
    if not extra_head then return end
    local a, b = reader.read_name(head), reader.read_name(embed)
    if ffi.C.memcmp(a:data_ptr(), b:data_ptr(), 4 * a:numel()) ~= 0 then
      fail("%s/%s: tensor '%s' differs from '%s' but config.json ties them " ..
           "(tie_word_embeddings)", dir, where[head], head, embed)
    end
  end
  function reader.close()
    for _, f in pairs(files) do f:close() end
  end
  return reader
end

-- The Tetra parameters of Hugging Face folder dir: an array of { name, tensor } and the
-- model keys.
local function read_hf_params(dir, opts)
  local layout = check_rope_layout(opts or {})
  local reader = open_hf(dir)
  reader.check_tied_head()
  local out = {}
  T.no_grad(function()
    for _, r in ipairs(reader.rules) do
      for i, t in ipairs(from_hf(r, reader.read(r), layout)) do out[#out + 1] = { r.tetra[i], t } end
    end
  end)
  reader.close()
  return out, reader.model
end

-- -- Tetra checkpoints -----------------------------------------------------------------

local MODEL_KEYS = { "dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_hidden",
                     "norm_eps", "rope_theta", "tie_embeddings", "seq_len", "init_std" }

-- Whether the rules of model m name exactly the checkpoint's parameters.
local function names_match(w, m)
  local want, n = {}, 0
  for _, r in ipairs(rules_for(m)) do
    for _, name in ipairs(r.tetra) do
      if not w.shape(name) then return false end
      if not want[name] then n = n + 1 end
      want[name] = true
    end
  end
  return n == #w.names
end

-- The model keys of an opened checkpoint (its state.json's config). The family is the
-- config's, else the one whose mapping names exactly the checkpoint's parameters, else
-- the first whose embedding it holds (checkpoint_rules then says what differs).
local function checkpoint_model(w)
  local c = type(w.state.config) == "table" and w.state.config.model
  if type(c) ~= "table" then fail("checkpoint %s: state.json has no model config", w.path) end
  local m = {}
  for _, k in ipairs(MODEL_KEYS) do m[k] = c[k] end
  for _, k in ipairs({ "dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_hidden",
                       "seq_len" }) do
    if type(m[k]) ~= "number" then
      fail("checkpoint %s: state.json's model.%s is missing", w.path, k)
    end
  end
  local families = hf_families()
  if families[c.family] then
    m.family = c.family
  else
    local names, embeds = {}, nil
    for _, name in ipairs(models.names()) do
      if families[name] then
        names[#names + 1] = name
        m.family = name
        if names_match(w, m) then break end
        m.family = nil
        if not embeds and w.shape(models.get(name).embedding .. ".weight") then embeds = name end
      end
    end
    m.family = m.family or embeds
    if not m.family then
      fail("checkpoint %s holds no model of a family with a Hugging Face mapping (%s): " ..
           "its parameter names match none", w.path, table.concat(names, ", "))
    end
  end
  if not models.get(m.family).rotary then m.rope_theta = nil end
  return m
end

-- The rules of a checkpoint's model, every parameter accounted for.
local function checkpoint_rules(w, m)
  local rules, want = rules_for(m), {}
  for _, r in ipairs(rules) do
    for i, name in ipairs(r.tetra) do
      want[name] = true
      local have = w.shape(name)
      if not have then fail("checkpoint %s has no parameter '%s'", w.path, name) end
      if shape_text(have) ~= shape_text(r.shapes[i]) then
        fail("checkpoint %s: parameter '%s' has shape %s but its model config implies %s",
             w.path, name, shape_text(have), shape_text(r.shapes[i]))
      end
    end
  end
  for _, name in ipairs(w.names) do
    if not want[name] then
      fail("checkpoint %s: parameter '%s' has no Hugging Face %s counterpart", w.path, name,
           m.family)
    end
  end
  return rules
end

-- -- Writing ---------------------------------------------------------------------------

-- "5GB" (10^9), "200MB", "2GiB" (2^30), "100KB", or a byte count -> bytes.
function M.parse_size(text)
  local n, unit = tostring(text):match("^(%d+%.?%d*)%s*(%a*)$")
  local scale = ({ [""] = 1, B = 1, KB = 1e3, MB = 1e6, GB = 1e9, KIB = 2^10, MIB = 2^20,
                   GIB = 2^30 })[unit and unit:upper() or ""]
  if not n or not scale or tonumber(n) * scale < 1 then
    fail("--max-shard-size must be a size such as 5GB, 200MB or 10000 (bytes), got '%s'",
         tostring(text))
  end
  return math.floor(tonumber(n) * scale)
end

local function refuse_existing(out)
  if exists(out) then fail("%s already exists: choose a new output directory", out) end
end

-- Writes folder out: config.json and the tensors that make(r) returns for each rule,
-- split into shards of at most max_shard bytes (one tensor larger than that gets a shard
-- of its own, as transformers does). Written into out.tmp, renamed when complete.
local function write_hf(out, m, rules, make, max_shard)
  refuse_existing(out)
  local tmp = out .. ".tmp"
  if exists(tmp) then fs.remove_tree(tmp, "checkpoint") end   -- left by an interrupted conversion
  fs.mkdir_p(tmp, "checkpoint.dir")
  local shards, size = { {} }, 0
  for _, r in ipairs(rules) do
    local bytes = 4 * numel(hf_shape(r))
    if size > 0 and size + bytes > max_shard then
      shards[#shards + 1] = {}
      size = 0
    end
    table.insert(shards[#shards], r)
    size = size + bytes
  end
  local weight_map, total = {}, 0
  for k, list in ipairs(shards) do
    local file = #shards == 1 and "model.safetensors" or
                 string.format("model-%05d-of-%05d.safetensors", k, #shards)
    local entries = {}
    for _, r in ipairs(list) do
      entries[#entries + 1] = { r.hf, make(r) }
      weight_map[r.hf] = file
      total = total + 4 * numel(hf_shape(r))
    end
    st.save(tmp .. "/" .. file, entries, { format = "pt" })
    for _, e in ipairs(entries) do e[2]:free() end
    collectgarbage()
  end
  if #shards > 1 then
    fs.write_file(tmp .. "/" .. INDEX, json.encode({
      metadata = { total_size = total }, weight_map = weight_map }) .. "\n", "checkpoint")
  end
  fs.write_file(tmp .. "/config.json", json.encode(family_hf(m.family).to_config(m)) .. "\n", "checkpoint")
  local ok, err = os.rename(tmp, out)
  if not ok then fail("cannot rename %s to %s: %s", tmp, out, tostring(err)) end
  return #shards
end

-- -- Commands --------------------------------------------------------------------------

-- Tetra checkpoint (or checkpoint directory with latest) -> Hugging Face folder out.
-- opts: max_shard_size (bytes), rope_layout. Returns the number of files and the family.
function M.export(ckpt, out, opts)
  opts = opts or {}
  local layout = check_rope_layout(opts)
  local w = checkpoint.open_weights(ckpt)
  local m = checkpoint_model(w)
  local rules = checkpoint_rules(w, m)
  local n = T.no_grad(function()
    return write_hf(out, m, rules, function(r)
      local ts = {}
      for i, name in ipairs(r.tetra) do ts[i] = w.read(name) end
      return to_hf(r, ts, layout)
    end, opts.max_shard_size or 5e9)
  end)
  w.close()
  return n, m.family
end

-- Hugging Face folder -> weights-only Tetra checkpoint out. Returns the family.
function M.import(dir, out, opts)
  refuse_existing(out)
  local params, m = read_hf_params(dir, opts)
  local cfg = { model = {} }
  for _, k in ipairs(MODEL_KEYS) do cfg.model[k] = m[k] end
  cfg.model.family = m.family
  checkpoint.save_weights(out, params, cfg, { hf = dir, rope_layout = opts and opts.rope_layout or "hf" })
  return m.family
end

-- -- model.init_from ---------------------------------------------------------------------

-- "hf:DIR" -> "hf", DIR; a checkpoint path -> "checkpoint", path.
local function parse_source(source)
  if type(source) ~= "string" or source == "" then
    fail("model.init_from must be hf:DIR (a Hugging Face folder) or a Tetra checkpoint " ..
         "directory, got %s", tostring(source))
  end
  local dir = source:match("^hf:(.+)$")
  if dir then return "hf", dir end
  if exists(source .. "/config.json") and not exists(source .. "/state.json") and
     not exists(source .. "/latest") then
    fail("%s is a Hugging Face folder, not a Tetra checkpoint: write model.init_from=hf:%s",
         source, source)
  end
  return "checkpoint", source
end

-- model.init_from=hf:DIR read once the model is split: the folder's tensors as the index
-- tetra.checkpoint.shards reads slices from ({ TETRA_NAME = { shape =, shards = { { file
-- =, dim = 0, offset = 0, length =, name = the folder's name, transposed =, at = } } } }:
-- GPT-2's Conv1D weights are Tetra's transposed, c_attn holds q, k and v side by side, its
-- bias one after the other), so that each rank reads its own part, cast from the folder's
-- dtype; nil for a source that is not hf:. The folder is checked first (names, dtypes,
-- shapes, a tied head saved anyway).
function M.sliced_index(source)
  local kind, dir = parse_source(source)
  if kind ~= "hf" then return nil end
  local reader = open_hf(dir)
  local tensors = {}
  for _, r in ipairs(reader.rules) do
    -- copy, rope (transformers' order is Tetra's): the tensor itself; t: it transposed;
    -- qkv: side by side, each transposed (its rows from `at` of the file's columns); cat:
    -- one after the other (from `at` of its rows).
    local at = 0
    for i, name in ipairs(r.tetra) do
      local shape = r.shapes[i]
      tensors[name] = { shape = shape, shards = { {
        file = reader.file_of(r.hf), dim = 0, offset = 0, length = shape[1], name = r.hf,
        transposed = (r.kind == "t" or r.kind == "qkv") or nil,
        at = (r.kind == "qkv" or r.kind == "cat") and at or nil } } }
      at = at + shape[1]
    end
  end
  reader.check_tied_head()
  reader.close()
  return tensors, dir
end

-- The model keys (family included) of model.init_from's source; the headers (hf) or
-- the index (checkpoint) are checked against them.
function M.model_config(source)
  local kind, path = parse_source(source)
  if kind == "hf" then
    local reader = open_hf(path)
    reader.close()
    return reader.model
  end
  local w = checkpoint.open_weights(path)
  local m = checkpoint_model(w)
  checkpoint_rules(w, m)
  w.close()
  return m
end

-- Copies the weights of source (model.init_from) into model, built whole from the
-- matching config: every parameter must be there with its shape. (A recipe's set-up reads
-- a Tetra checkpoint once the model is split instead, each rank its own part:
-- tetra.checkpoint.init_weights.)
function M.init_weights(model, source)
  local kind, path = parse_source(source)
  local params
  if kind == "hf" then
    params = read_hf_params(path)
  else
    local w = checkpoint.open_weights(path)
    params = {}
    for _, name in ipairs(w.names) do params[#params + 1] = { name, w.read(name) } end
    w.close()
  end
  local by_name = {}
  for _, p in ipairs(params) do by_name[p[1]] = p[2] end
  T.no_grad(function()
    for _, np in ipairs(model:named_parameters()) do
      local name, t = np[1], np[2]
      local src = by_name[name]
      if not src then
        fail("model.init_from=%s has no parameter '%s' (this recipe's model has it: " ..
             "a different model family?)", source, name)
      end
      if shape_text(src:shape()) ~= shape_text(t:shape()) then
        fail("model.init_from=%s: parameter '%s' has shape %s, the model %s", source, name,
             shape_text(src:shape()), shape_text(t:shape()))
      end
      t:copy_(src)
      by_name[name] = nil
    end
  end)
  local left = next(by_name)
  if left then
    fail("model.init_from=%s has parameter '%s', which this recipe's model lacks (a " ..
         "different model family?)", source, left)
  end
end

-- The family whose model.lua builds class Model, or nil (tetra.train checks a source's
-- family against the recipe's with it).
M.family_of = models.family_of

return M
