-- tetra.config: the configuration schema, presets, merging and validation.
--
-- A config is a table of sections (train, parallel, data, model, optim, checkpoint, log,
-- dist), each a table of keys. Precedence, lowest first:
--   schema defaults < recipe defaults < model preset < YAML file < --set key=value
-- The preset (llama-7b, gpt2-124m ...; each model family's recipes/<family>/presets.lua,
-- found through tetra.models) is named by train.model_name or model.name and fills
-- model.* keys the YAML and --set leave alone.
--
-- Validation runs before anything is allocated. Every problem is a config error naming
-- the key and the fix; unknown keys suggest the nearest known one. Modules add their own
-- keys with config.register(section, keys) or by dropping a file in lua/tetra/config/schema/
-- that returns { section = { key = spec } }; cross-key rules go through
-- config.register_check(fn), and a model read from elsewhere (model.init_from) through
-- config.register_model_source(fn). A schema file reaches those through
-- tetra.config.registry (tetra.config loads it: it cannot require tetra.config back).

local host = require("tetra.host")
local models = require("tetra.models")
local registry = require("tetra.config.registry")
local errors = require("tetra.util.errors")
local layout = require("tetra.parallel.layout")

local M = {}

-- -- Errors --------------------------------------------------------------------------

-- config.error(fmt, ...) raises a config error; main.c prints its message without a
-- traceback. config.is_error(e) tells one apart.
M.error, M.is_error = registry.error, registry.is_error

-- -- Schema --------------------------------------------------------------------------
-- A key spec: { type = "int"|"num"|"bool"|"str"|"enum"|"list"|"any", default = v,
--               min = n, values = {...} (enum), doc = "..." }

local function int(default, min, doc) return { type = "int", default = default, min = min, doc = doc } end
local function num(default, min, doc) return { type = "num", default = default, min = min, doc = doc } end
local function bool(default, doc) return { type = "bool", default = default, doc = doc } end
local function str(default, doc) return { type = "str", default = default, doc = doc } end
local function enum(default, values, doc) return { type = "enum", default = default, values = values, doc = doc } end
local function list(doc) return { type = "list", doc = doc } end
local function any(default, doc) return { type = "any", default = default, doc = doc } end

M.schema = {
  train = {
    model_name = str(nil, "preset (recipes/*/presets.lua): llama-7b, llama3-8b, gpt2-124m, qwen2-7b, ..."),
    recipe = str(nil, "a YAML config's recipe: name (recipes/NAME.lua or recipes/NAME/model.lua) " ..
                 "or path; default from the preset family"),
    precision = enum("fp32", { "fp32", "bf16", "fp16", "fp8" },
                     "compute precision; fp32 master weights in every one (docs/precision.md)"),
    device = str("cpu", "cpu, cuda (this rank's GPU) or cuda:N"),
    loss_scale_init = num(65536, 1, "fp16: initial dynamic loss scale"),
    loss_scale_growth_factor = num(2, 1, "fp16: scale growth after loss_scale_growth_interval clean steps"),
    loss_scale_backoff = num(0.5, 0, "fp16: scale factor on a step with inf/NaN grads (< 1)"),
    loss_scale_growth_interval = int(2000, 1, "fp16: clean steps between scale growths"),
    fp8_history = int(16, 1, "fp8: amax history length of the delayed scaling"),
    fp8_margin = int(0, 0, "fp8: headroom in powers of two"),
    batch_size = int(8, 1, "global batch in sequences per optimizer step"),
    gradient_accumulation_steps = int(1, 1, "micro-batches per optimizer step and DP rank"),
    steps = int(100, 0, "optimizer steps"),
    lr = num(3e-4, 0, "peak learning rate"),
    lr_schedule = enum("cosine", { "cosine", "constant", "linear", "wsd" },
                       "decay from lr to min_lr after the warmup; wsd (warmup-stable-decay): " ..
                       "lr held, then decayed over the last lr_decay_steps"),
    lr_decay_steps = int(nil, 1, "wsd: steps of the final decay to min_lr, the last of " ..
                         "train.steps (a stable-phase checkpoint resumes with more steps)"),
    lr_decay_shape = enum(nil, { "linear", "cosine", "sqrt" },
                          "wsd: the final decay's shape, linear when unset; sqrt: " ..
                          "min_lr + (lr - min_lr) x (1 - sqrt of its progress)"),
    warmup_steps = int(0, 0, "steps of linear warmup to lr"),
    min_lr = num(0, 0, "learning rate at the end of the decay"),
    weight_decay = num(0.1, 0, "AdamW decoupled weight decay"),
    max_grad_norm = num(1.0, 0, "0 disables clipping"),
    seed = int(1234, 0, "seed of the init, the mock tokens, the data order and the samples"),
    eval_every = int(0, 0, "0 disables evaluation"),
    eval_steps = int(10, 1, "held-out global batches per evaluation"),
    sample_every = int(0, 0, "generate a text sample every N steps (0: at the end only)"),
    sample_tokens = int(64, 0, "tokens generated per text sample"),
    temperature = num(0.8, 0, "sampling temperature of the text samples"),
    top_k = int(40, 0, "sample among the k likeliest tokens (0: all)"),
    prompt = str(nil, "prompt of the text samples (unset: a newline)"),
    threads = int(0, 0, "CPU threads (0: OMP_NUM_THREADS or all cores)"),
    micro_batch_size = int(nil, 1, "derived: batch_size / (gradient_accumulation_steps x data_parallel_size)"),
  },
  parallel = {
    data_parallel_size = int(1, 1, "data-parallel replicas (gradients averaged)"),
    tensor_parallel_size = int(1, 1, "Megatron tensor parallelism: heads, MLP units, vocabulary split"),
    pipeline_parallel_size = int(1, 1, "pipeline stages (blocks split over ranks)"),
    context_parallel_size = int(1, 1, "each sequence split into 2 x this many chunks"),
    virtual_pipeline_size = int(1, 1, "virtual stages per rank (interleaved 1F1B)"),
    zero_stage = int(0, 0, "1: shard the AdamW state over the data-parallel ranks; 2: the gradients too; " ..
                    "3: the parameters too (gathered block by block)"),
    order = str("tp-cp-dp-pp", "mesh order, fastest-varying first"),
    pipeline_schedule = enum("1f1b", { "gpipe", "1f1b", "interleaved_1f1b" },
                             "order of the micro-batches' forwards and backwards"),
    pipeline_stages = list("explicit layer counts per stage"),
    sequence_parallel = bool(false, "keep the residual stream on 1/tp of the sequence between TP regions"),
  },
  data = {
    input_path = any(nil, "file, glob or list of them"),
    eval_path = any(nil, "held-out evaluation data (paths like input_path)"),
    eval_fraction = num(0.01, 0, "without eval_path: the end of each training source held out for evaluation"),
    vocab_file = str(nil, "tokenizer.json, GPT-2 vocab.json (merges beside it) or .tiktoken"),
    merges_file = str(nil, "GPT-2 merges.txt (default: beside vocab_file)"),
    tokenizer = str("byte", "byte, or a tokenizer file"),
    online_tokenization = bool(true, "false: read shards made by tetra data prepare"),
    shuffle_buffer_size = int(10000, 0, "sequences each stream shuffles among"),
    num_workers = int(2, 0, "tokenizer worker threads per rank"),
    mock = bool(false, "random tokens instead of a corpus (benchmarks)"),
    num_streams = int(1, 1, "loader streams feeding each global batch (independent of the DP size)"),
    datasets = list("a weighted blend instead of input_path: [{path: FILES, weight: 3}, " ..
                    "{path: ..., type: jsonl|text|tfrecord|tokens, text_field: ...}, ...]; " ..
                    "weight > 0 (default 1)"),
    prefetch = int(2, 1, "optimizer steps of sequences each loader stream keeps ready"),
    text_field = str("text", "the JSONL field / TFRecord bytes feature holding the text"),
    s3_endpoint = str(nil, "S3-compatible endpoint URL (default: AWS_ENDPOINT_URL, else AWS)"),
    s3_region = str(nil, "S3 region (default: AWS_REGION, else us-east-1)"),
    s3_retries = int(6, 0, "retries of a failed S3 request (5xx, timeouts, dropped connections)"),
    s3_timeout_s = num(20, 0.1, "seconds before a stalled S3 connection or transfer is retried"),
    s3_block_mb = num(8, 0.001, "MiB per ranged S3 read; one block per file is read ahead"),
    seed = int(nil, 0, "seed of the data order (default train.seed)"),
  },
  model = {
    name = str(nil, "preset name, same as train.model_name (naming two different ones is an error)"),
    family = enum(nil, models.names(), "model family: a folder of recipes/ with a model.lua (set by the preset)"),
    dim = int(nil, 1, "model width"),
    n_layers = int(nil, 1, "transformer blocks"),
    n_heads = int(nil, 1, "attention heads"),
    n_kv_heads = int(nil, 1, "key/value heads (grouped-query attention; default n_heads)"),
    vocab_size = int(nil, 1, "vocabulary size"),
    seq_len = int(nil, 1, "training sequence length in tokens"),
    ffn_hidden = int(nil, 1, "MLP hidden units (default from dim, by the family's presets.lua)"),
    norm_eps = num(1e-5, 0, "epsilon of RMSNorm / LayerNorm"),
    rope_theta = num(10000, 0, "base of the rotary embedding frequencies (Llama); > 0"),
    tie_embeddings = bool(nil, "the output head shares the embedding (default: the family's presets.lua)"),
    init_std = num(0.02, 0, "standard deviation of the weights' normal init"),
  },
  optim = {
    name = enum("adamw", { "adamw", "sgd" }, "optimizer"),
    beta1 = num(0.9, 0, "AdamW first-moment decay (below 1)"),
    beta2 = num(0.95, 0, "AdamW second-moment decay (below 1)"),
    eps = num(1e-8, 0, "AdamW denominator epsilon"),
    momentum = num(0.9, 0, "SGD momentum"),
  },
  checkpoint = {   -- lua/tetra/checkpoint/init.lua
    dir = str(nil, "checkpoint directory: a checkpoint at the last step (unset: no checkpoints)"),
    every = int(0, 0, "with checkpoint.dir: save every N steps too (0: only at the last step)"),
    keep = int(2, 0, "checkpoints kept in dir, newest first (0: all)"),
    resume = any(false, "true / \"auto\" (dir/latest, if any) / a checkpoint path"),
  },
  log = {
    metrics_file = str(nil, "JSONL file of one record per optimizer step (docs/monitoring.md)"),
    every = int(1, 1, "steps between progress lines when not on a terminal"),
    log_file = str(nil, "per-rank text log; {rank} is replaced by the rank"),
    progress = bool(true, "rank 0 prints the progress line"),
  },
  dist = {
    timeout_s = num(600, 0, "seconds before the watchdog reports a stuck collective and aborts"),
    bucket_mb = num(25, 0, "MB per gradient bucket of the data-parallel reduction"),
    sparse_embedding_grad = bool(false, "average an embedding's gradient as the rows " ..
                                 "the step's tokens touched, not the whole table"),
    defer_weight_grads = bool(true, "compute the first blocks' weight gradients after " ..
                              "the embedding's, so its reduction overlaps them"),
  },
}

-- Adds keys to a section (creating it). keys: { name = spec } where spec is a table
-- made like the ones above, or a plain default value (type taken from it).
function M.register(section, keys)
  local sec = M.schema[section] or {}
  M.schema[section] = sec
  for name, spec in pairs(keys) do
    if type(spec) ~= "table" or not spec.type then
      local t = type(spec)
      spec = { default = spec,
               type = t == "number" and "num" or t == "boolean" and "bool" or t == "string" and "str" or "any" }
    end
    sec[name] = spec
  end
end

-- Cross-key checks, fn(cfg), and model sources, fn(merged, user) (tetra.config.registry).
M.register_check, M.register_model_source = registry.register_check, registry.register_model_source
M.run_check = registry.run_check

local schema_dirs_loaded = false
local function load_schema_dir()
  if schema_dirs_loaded then return end
  schema_dirs_loaded = true
  local dir = host.root .. "/lua/tetra/config/schema"
  if not host.is_dir(dir) then return end
  for _, f in ipairs(host.listdir(dir) or {}) do
    local name = f:match("^(.-)%.lua$")
    if name then
      local ext = require("tetra.config.schema." .. name)
      for section, keys in pairs(ext) do M.register(section, keys) end
    end
  end
end
-- The whole schema, the files of schema/ included (tetra docs config prints it).
M.load_schema = load_schema_dir

-- -- Helpers -------------------------------------------------------------------------

local function deep_copy(v)
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = deep_copy(x) end
  return out
end
M.copy = deep_copy

-- Merges `over` into a copy of `base`: sections and keys of `over` win; lists replace.
function M.merge(base, over)
  local out = deep_copy(base or {})
  for section, keys in pairs(over or {}) do
    if type(keys) == "table" and type(out[section]) == "table" and #keys == 0 then
      for k, v in pairs(keys) do out[section][k] = deep_copy(v) end
    else
      out[section] = deep_copy(keys)
    end
  end
  return out
end

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end

local function edit_distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

-- "did you mean" for an unknown key: the closest key of the same section, or the same
-- key name in another section.
local function suggest(section, key)
  local best, best_d = nil, math.huge
  local sec = M.schema[section]
  if sec then
    for _, k in ipairs(sorted_keys(sec)) do
      local d = edit_distance(key, k)
      if d < best_d then best, best_d = section .. "." .. k, d end
    end
    if best_d > math.max(2, math.floor(#key / 3)) then best = nil end
  end
  if not best then
    for _, s in ipairs(sorted_keys(M.schema)) do
      if M.schema[s][key] then best = s .. "." .. key; break end
    end
  end
  return best and (" (did you mean '" .. best .. "'?)") or ""
end

local function suggest_section(name)
  local best, best_d = nil, math.huge
  for _, s in ipairs(sorted_keys(M.schema)) do
    local d = edit_distance(name, s)
    if d < best_d then best, best_d = s, d end
  end
  if best_d <= 2 then return " (did you mean '" .. best .. "'?)" end
  return " (sections: " .. table.concat(sorted_keys(M.schema), ", ") .. ")"
end

local function show(v)
  if type(v) == "string" then return ("'%s'"):format(v) end
  if type(v) == "table" then return "a table" end
  return tostring(v)
end

-- Parses a --set value: numbers, booleans, null and [flow, lists] as YAML reads them,
-- anything else as the string itself.
function M.parse_value(text)
  if text == "" then return "" end
  local v = host.parse_yaml(text)
  if type(v) == "table" and not text:match("^%s*[%[{]") then return text end
  if v == nil and not (text == "null" or text == "~" or text == "nil") then return text end
  return v
end

-- "train.batch_size=8" -> section, key, value
function M.parse_set(kv)
  local path, value = kv:match("^([^=]+)=(.*)$")
  if not path then M.error("--set needs key=value, got '%s'", kv) end
  local section, key = path:match("^([%w_]+)%.([%w_]+)$")
  if not section then
    M.error("--set key '%s' must look like section.key (e.g. train.batch_size)", path)
  end
  return section, key, M.parse_value(value)
end

-- Applies a list of "k=v" strings to a copy of cfg.
function M.apply_sets(cfg, sets)
  cfg = deep_copy(cfg or {})
  for _, kv in ipairs(sets or {}) do
    local section, key, value = M.parse_set(kv)
    cfg[section] = cfg[section] or {}
    if type(cfg[section]) ~= "table" then M.error("'%s' is not a section", section) end
    cfg[section][key] = value
  end
  return cfg
end

-- -- Validation ----------------------------------------------------------------------

local function check_key(section, key, v, spec)
  local name = section .. "." .. key
  local t = spec.type
  if t == "int" or t == "num" then
    if type(v) ~= "number" or (t == "int" and v % 1 ~= 0) then
      M.error("%s must be %s, got %s", name, t == "int" and "an integer" or "a number", show(v))
    end
    if spec.min and v < spec.min then
      M.error("%s must be >= %s, got %s", name, tostring(spec.min), show(v))
    end
  elseif t == "bool" then
    if type(v) ~= "boolean" then M.error("%s must be true or false, got %s", name, show(v)) end
  elseif t == "str" then
    if type(v) ~= "string" then M.error("%s must be a string, got %s", name, show(v)) end
  elseif t == "enum" then
    local ok = false
    for _, x in ipairs(spec.values) do ok = ok or x == v end
    if not ok then
      M.error("%s must be one of %s, got %s", name, table.concat(spec.values, ", "), show(v))
    end
  elseif t == "list" then
    if type(v) ~= "table" then M.error("%s must be a list, got %s", name, show(v)) end
  end
end

-- The number of processes this job runs on (1 outside mpirun).
function M.world_size()
  for _, var in ipairs({ "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "WORLD_SIZE" }) do
    local v = tonumber(os.getenv(var) or "")
    if v then return v end
  end
  return 1
end

-- Raises the first problem of cfg's parallel layout on `world` processes as a config
-- error: the layout's rules for a config built in code, which has not met config.validate.
function M.check_layout(cfg, world)
  local problems = layout.problems(cfg, world)
  if #problems > 0 then M.error("%s", problems[1]) end
end

local function check_model(cfg)
  local m = cfg.model
  for _, k in ipairs({ "dim", "n_layers", "n_heads", "vocab_size", "seq_len" }) do
    if m[k] == nil then
      M.error("model.%s is not set: pick a preset with train.model_name (%s) or set model.%s",
              k, table.concat(sorted_keys(models.presets()), ", "), k)
    end
  end
  if m.dim % m.n_heads ~= 0 then
    M.error("model.n_heads (%d) must divide model.dim (%d): head dim = dim / n_heads", m.n_heads, m.dim)
  end
  if m.n_heads % m.n_kv_heads ~= 0 then
    M.error("model.n_kv_heads (%d) must divide model.n_heads (%d) (grouped-query attention)",
            m.n_kv_heads, m.n_heads)
  end
  if m.family and models.of(m).rotary and (m.dim / m.n_heads) % 2 ~= 0 then
    M.error("model.dim / model.n_heads (%d) must be even for rotary embeddings", m.dim / m.n_heads)
  end
end

-- Fills model keys that follow from others (the family's rules, its presets.lua).
local function derive_model(m)
  local fam = models.of(m)
  if m.n_heads and not m.n_kv_heads then m.n_kv_heads = m.n_heads end
  if m.dim and not m.ffn_hidden then m.ffn_hidden = fam.ffn_hidden(m.dim) end
  if m.tie_embeddings == nil then m.tie_embeddings = fam.tied == true end
end

-- Checks every key of cfg against the schema and fills defaults. Returns cfg.
-- opts.world_size: the process count to check the layout against (false: skip).
function M.validate(cfg, opts)
  opts = opts or {}
  load_schema_dir()
  for _, section in ipairs(sorted_keys(cfg)) do
    local keys = cfg[section]
    if not M.schema[section] then
      M.error("unknown section '%s'%s", tostring(section), suggest_section(tostring(section)))
    end
    if type(keys) ~= "table" then
      M.error("'%s' must be a section of key: value pairs, got %s", section, show(keys))
    end
    for _, key in ipairs(sorted_keys(keys)) do
      if not M.schema[section][key] then
        M.error("unknown key '%s.%s'%s", section, tostring(key), suggest(section, tostring(key)))
      end
    end
  end
  for section, spec_keys in pairs(M.schema) do
    cfg[section] = cfg[section] or {}
    for key, spec in pairs(spec_keys) do
      local v = cfg[section][key]
      if spec.type == "list" and type(v) == "string" and v:match("^%s*%d+%s*,[%d%s,]*$") then
        local items = {}   -- --set parallel.pipeline_stages=1,3 (no brackets to quote)
        for n in v:gmatch("%d+") do items[#items + 1] = tonumber(n) end
        v = items
        cfg[section][key] = v
      end
      if v == nil then
        cfg[section][key] = deep_copy(spec.default)
      else
        check_key(section, key, v, spec)
      end
    end
  end
  if cfg.model.dim or cfg.model.n_layers or cfg.model.n_heads then
    derive_model(cfg.model)
    check_model(cfg)
  end
  local world = opts.world_size
  if world == nil then world = M.world_size() end
  -- Every rule about the parallel layout lives in tetra.parallel.layout.
  local problems = layout.problems(cfg, world or nil)
  if #problems > 0 then
    local msg = problems[1]
    -- Started with the wrong process count (the guide's 64-process YAML on one machine),
    -- nothing runs here anyway: name everything else this machine lacks too.
    if world and msg:match("^this layout needs %d+ processes") then
      local missing = require("tetra.config.preflight").problems(cfg)
      if #missing > 0 then msg = msg .. "\nalso missing here:\n  " .. table.concat(missing, "\n  ") end
    end
    M.error("%s", msg)
  end
  if cfg.train.eval_every > 0 and not cfg.data.mock and not cfg.data.eval_path and
     cfg.data.eval_fraction == 0 and cfg.data.input_path then
    M.error("train.eval_every (%d) needs held-out data: set data.eval_path, or " ..
            "data.eval_fraction > 0 to hold out the end of each training source, or " ..
            "train.eval_every=0", cfg.train.eval_every)
  end
  if cfg.data.input_path and cfg.data.datasets then
    M.error("data.input_path and data.datasets are both set: keep one (data.datasets " ..
            "blends several sources, each {path: FILES, weight: W})")
  end
  if cfg.data.eval_fraction >= 1 then
    M.error("data.eval_fraction (%g) must be below 1 (it is the held-out share of each source)",
            cfg.data.eval_fraction)
  end
  if cfg.train.min_lr > cfg.train.lr then
    M.error("train.min_lr (%g) must not exceed train.lr (%g)", cfg.train.min_lr, cfg.train.lr)
  end
  if cfg.train.warmup_steps > cfg.train.steps and cfg.train.steps > 0 then
    M.error("train.warmup_steps (%d) must not exceed train.steps (%d)",
            cfg.train.warmup_steps, cfg.train.steps)
  end
  local t = cfg.train
  if t.lr_schedule == "wsd" then
    if not t.lr_decay_steps then
      M.error("train.lr_schedule=wsd needs train.lr_decay_steps: the steps of the final " ..
              "decay to train.min_lr, the last of train.steps (a fifth of them, say)")
    end
    if t.steps > 0 and t.lr_decay_steps > t.steps - t.warmup_steps then
      M.error("train.lr_decay_steps (%d) must not exceed train.steps - train.warmup_steps " ..
              "(%d): the decay comes after the warmup", t.lr_decay_steps, t.steps - t.warmup_steps)
    end
  else
    for _, k in ipairs({ "lr_decay_steps", "lr_decay_shape" }) do
      if t[k] ~= nil then
        M.error("train.%s applies to train.lr_schedule=wsd (this run's is %s): drop it or " ..
                "set train.lr_schedule=wsd", k, t.lr_schedule)
      end
    end
  end
  local device = cfg.train.device
  if device ~= "cpu" and device ~= "cuda" and not device:match("^cuda:%d+$") then
    M.error("train.device must be cpu, cuda or cuda:N, got %s", show(device))
  end
  if cfg.model.rope_theta <= 0 then
    M.error("model.rope_theta must be > 0, got %s (the base of the rotary frequencies: " ..
            "Llama 2 uses 10000, Llama 3 500000)", show(cfg.model.rope_theta))
  end
  for _, k in ipairs({ "beta1", "beta2" }) do
    if cfg.optim[k] >= 1 then
      M.error("optim.%s must be below 1, got %s (a moment's decay per step; 0.9 and 0.95 " ..
              "are usual)", k, show(cfg.optim[k]))
    end
  end
  if cfg.train.loss_scale_backoff >= 1 then
    M.error("train.loss_scale_backoff must be below 1, got %s", show(cfg.train.loss_scale_backoff))
  end
  local micro = cfg.train.batch_size /
    (cfg.train.gradient_accumulation_steps * cfg.parallel.data_parallel_size)
  if cfg.train.micro_batch_size and cfg.train.micro_batch_size ~= micro then
    M.error("train.micro_batch_size (%d) disagrees with train.batch_size / (gradient_accumulation_steps " ..
            "x data_parallel_size) = %g: set train.batch_size instead", cfg.train.micro_batch_size, micro)
  end
  cfg.train.micro_batch_size = micro
  local ck = cfg.checkpoint
  if (ck.every > 0 or ck.resume == true or ck.resume == "auto") and not ck.dir then
    M.error("checkpoint.%s needs checkpoint.dir (where checkpoints go)",
            ck.every > 0 and "every" or "resume")
  end
  local r = ck.resume
  if not (type(r) == "boolean" or (type(r) == "string" and r ~= "")) then
    M.error("checkpoint.resume must be true, false, \"auto\" or a checkpoint path, got %s", show(r))
  end
  for _, fn in ipairs(registry.checks) do fn(cfg) end
  return cfg
end

-- Keys a recipe's defaults introduce become known keys of their section.
local function register_defaults(defaults)
  for section, keys in pairs(defaults or {}) do
    if type(keys) == "table" then
      local sec = M.schema[section] or {}
      M.schema[section] = sec
      for key, v in pairs(keys) do
        if not sec[key] then
          local t = type(v)
          sec[key] = { type = t == "number" and "num" or t == "boolean" and "bool" or
                              t == "string" and "str" or "any" }
        end
      end
    end
  end
end

-- The preset cfg names: train.model_name, or model.name (the same key, kept for configs
-- that group it with the model's keys); naming two different ones is an error.
local function preset_name(cfg)
  local a = type(cfg.train) == "table" and cfg.train.model_name or nil
  local b = type(cfg.model) == "table" and cfg.model.name or nil
  for k, v in pairs({ ["train.model_name"] = a, ["model.name"] = b }) do
    if v ~= nil and type(v) ~= "string" then M.error("%s must be a preset name, got %s", k, show(v)) end
  end
  if a and b and a ~= b then
    M.error("train.model_name (%s) and model.name (%s) name different presets: keep one",
            show(a), show(b))
  end
  return a or b
end

-- Keys that only one precision or one optimizer reads: set in the YAML or with --set
-- for a run of another, they would change nothing without a word, so they are refused.
local ONLY_FOR = {
  { when = "train.precision", is = "fp16", keys = { "train.loss_scale_init",
    "train.loss_scale_growth_factor", "train.loss_scale_backoff",
    "train.loss_scale_growth_interval" } },
  { when = "train.precision", is = "fp8", keys = { "train.fp8_history", "train.fp8_margin",
    "train.fp8_layers" } },
  { when = "optim.name", is = "sgd", keys = { "optim.momentum" } },
  { when = "optim.name", is = "adamw", keys = { "optim.beta1", "optim.beta2", "optim.eps" } },
}

local function refuse_unused(user, cfg)
  local function get(t, path)
    local section, key = path:match("^(%w+)%.([%w_]+)$")
    return type(t[section]) == "table" and t[section][key] or nil
  end
  for _, rule in ipairs(ONLY_FOR) do
    local now = get(cfg, rule.when)
    if now ~= rule.is then
      for _, k in ipairs(rule.keys) do
        if get(user, k) ~= nil then
          M.error("%s applies to %s=%s (this run's is %s): drop it or set %s=%s", k,
                  rule.when, rule.is, tostring(now), rule.when, rule.is)
        end
      end
    end
  end
end

-- Builds the final config, validated. The preset sits just below the layer that names
-- it: named by the YAML or --set, it overrides the recipe defaults' model keys; named by
-- the recipe defaults, those defaults' own model keys win over it.
-- parts: { defaults = tbl, yaml = tbl, sets = {"k=v", ...}, world_size = n | false }
function M.build(parts)
  load_schema_dir()
  register_defaults(parts.defaults)
  local user = M.apply_sets(parts.yaml or {}, parts.sets)
  -- Data the user names is what trains: a recipe's default mock tokens give way to
  -- data.input_path (or data.datasets) from the YAML or --set; asking for both is an error.
  local ud = user.data
  if type(ud) == "table" and ((ud.input_path and ud.input_path ~= "") or ud.datasets) then
    if ud.mock == true then
      M.error("data.mock=true and data.input_path (or data.datasets) are both set: drop one " ..
              "(mock trains on random tokens, ignoring the files)")
    end
    if ud.mock == nil then ud.mock = false end
  end
  local defaults = parts.defaults or {}
  local name = preset_name(user)
  local named_by_user = name ~= nil
  name = name or preset_name(defaults)
  local merged
  if name then
    local presets = models.presets()
    local preset = presets[name]
    if not preset then
      M.error("unknown model preset '%s' (train.model_name): choose one of %s, or set model.* keys",
              tostring(name), table.concat(sorted_keys(presets), ", "))
    end
    if named_by_user then
      merged = M.merge(M.merge(defaults, { model = preset }), user)
    else
      merged = M.merge(M.merge({ model = preset }, defaults), user)
    end
  else
    merged = M.merge(defaults, user)
  end
  for _, fn in ipairs(registry.model_sources) do fn(merged, user) end
  local cfg = M.validate(merged, { world_size = parts.world_size })
  refuse_unused(user, cfg)
  return cfg
end

-- -- Loading files -------------------------------------------------------------------

function M.load_yaml(path)
  local t, err = host.load_yaml(path)
  if err then M.error("%s", err) end
  if t ~= nil and (type(t) ~= "table" or #t > 0) then
    M.error("%s: expected a mapping of sections (train:, parallel:, data: ...), got %s",
            path, type(t) == "table" and "a list" or show(t))
  end
  for _, section in ipairs(sorted_keys(t or {})) do
    if type(t[section]) ~= "table" or #t[section] > 0 then
      M.error("%s: '%s' must be a section of key: value pairs, got %s", path, section,
              type(t[section]) == "table" and "a list" or show(t[section]))
    end
  end
  return t or {}
end

local function dirname(path) return path:match("^(.*)/[^/]*$") or "." end

-- Finds a recipe by name ("llama" -> recipes/llama.lua; a model family without one ->
-- recipes/NAME/model.lua) or path.
function M.find_recipe(name, base_dir)
  local candidates = {}
  if name:find("/", 1, true) or name:match("%.lua$") then
    candidates = { name, base_dir .. "/" .. name }
  else
    for _, dir in ipairs(host.source_dir ~= host.root and { host.root, host.source_dir } or { host.root }) do
      candidates[#candidates + 1] = dir .. "/recipes/" .. name .. ".lua"
      candidates[#candidates + 1] = dir .. "/recipes/" .. name .. "/model.lua"
    end
  end
  for _, p in ipairs(candidates) do
    local f = io.open(p)
    if f then f:close(); return p end
  end
  M.error("train.recipe: recipe '%s' not found (looked at %s)", name, table.concat(candidates, ", "))
end

local function load_recipe(path)
  local chunk, err = loadfile(path)
  if not chunk then registry.raise(err) end
  return chunk()
end

-- Loads FILE (a Lua recipe or a YAML config) and builds its config.
-- Returns recipe (table, or nil for a plain script that already ran), cfg.
function M.load(file, sets, opts)
  opts = opts or {}
  if file:match("%.ya?ml$") then
    local yaml = M.load_yaml(file)
    -- --set train.recipe=NAME picks the recipe as the YAML's own train.recipe does.
    local named = M.apply_sets(yaml, sets)
    local name = type(named.train) == "table" and named.train.recipe or nil
    if name ~= nil and (type(name) ~= "string" or name == "") then
      M.error("train.recipe must be a recipe name or path, got %s", show(name))
    end
    if not name then
      -- model.family names the recipe where the YAML names none (a model given by its
      -- keys alone); else the preset's family.
      local preset = models.presets()[preset_name(named) or ""]
      local family = type(named.model) == "table" and named.model.family or nil
      if type(family) ~= "string" or not models.get(family) then family = nil end  -- refused below
      name = family or preset and preset.family or models.default
    end
    local recipe = load_recipe(M.find_recipe(name, dirname(file)))
    if type(recipe) ~= "table" then M.error("recipe '%s' did not return a recipe table", name) end
    return recipe, M.build({ defaults = recipe.defaults, yaml = yaml, sets = sets,
                             world_size = opts.world_size })
  end
  local set_recipe = (M.apply_sets({}, sets).train or {}).recipe
  if set_recipe ~= nil then
    M.error("train.recipe picks the recipe of a YAML config, and %s is itself a recipe: " ..
            "drop --set train.recipe", file)
  end
  local recipe = load_recipe(file)
  if type(recipe) ~= "table" or not (recipe.run or recipe.setup) then return nil, nil end
  return recipe, M.build({ defaults = recipe.defaults, sets = sets, world_size = opts.world_size })
end

-- Only one rank prints a config error (every rank would find the same one).
local function is_rank0()
  for _, var in ipairs({ "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK" }) do
    local v = tonumber(os.getenv(var) or "")
    if v then return v == 0 end
  end
  return true
end

-- Reports a config error that every rank finds alike: rank 0 prints it; the others give
-- it time to, since under mpirun the first rank to exit non-zero gets the job killed
-- (rank 0's exit does that, once the message is out).
local function report(e)
  local ffi = require("ffi")
  if is_rank0() then
    io.stderr:write("tetra: ", e.message, "\n")
    io.stderr:flush()
  else
    pcall(ffi.cdef, "int poll(void *fds, unsigned long nfds, int timeout);")
    ffi.C.poll(nil, 0, 10000)
  end
  return 1
end
M.report = report

-- `tetra run FILE [--set k=v]...`; returns the exit code.
function M.run_file(file, sets)
  local ok, recipe, cfg = pcall(M.load, file, sets)
  if not ok then
    if M.is_error(recipe) then return report(recipe) end
    error(recipe, 0)
  end
  if not recipe then
    if sets and #sets > 0 then
      io.stderr:write("tetra: warning: --set ignored: ", file, " is not a recipe (it returned no table with run)\n")
    end
    return 0
  end
  if not recipe.run then M.error("recipe %s has no run(cfg) function", file) end
  -- A layout whose estimate exceeds the device's memory stops here, before the recipe
  -- builds the model (tetra.config.fit).
  local fit = require("tetra.config.fit")
  local checked, err = pcall(fit.check, cfg, M.world_size())
  if not checked then
    if M.is_error(err) then return report(err) end
    error(err, 0)
  end
  -- Config errors found while the recipe sets up (layout checks in tetra.train) are the
  -- same on every rank: printed once, like the ones found while loading. An allocator's
  -- out-of-memory becomes one line with the planner's advice; other errors keep the
  -- traceback of where they happened.
  local ran, rc = xpcall(recipe.run, function(e)
    if M.is_error(e) or (type(e) == "table" and e.user) then return e end
    if tostring(e):find("out of memory on ", 1, true) then
      return fit.out_of_memory(e, cfg, M.world_size())
    end
    return errors.new(debug.traceback(tostring(e), 2))
  end, cfg)
  if not ran then
    if M.is_error(rc) then return report(rc) end
    error(rc, 0)
  end
  if type(rc) == "number" then return rc end
  return 0
end

-- The config as YAML-ish text (for logs and the REPL).
function M.dump(cfg)
  local lines = {}
  for _, section in ipairs(sorted_keys(cfg)) do
    lines[#lines + 1] = section .. ":"
    for _, key in ipairs(sorted_keys(cfg[section])) do
      local v = cfg[section][key]
      if type(v) == "table" then
        local parts = {}
        for _, x in ipairs(v) do parts[#parts + 1] = type(x) == "table" and "{...}" or tostring(x) end
        v = "[" .. table.concat(parts, ", ") .. "]"
      end
      lines[#lines + 1] = ("  %s: %s"):format(key, tostring(v))
    end
  end
  return table.concat(lines, "\n")
end

return M
