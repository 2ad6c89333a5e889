-- tetra.checkpoint: save and resume the whole training state.
--
--   checkpoint.save(env)            -- DIR/step_NNNNNN/ for env.step_count, then DIR/latest
--   checkpoint.resume(env)          -- per checkpoint.resume; returns the path loaded or nil
--   checkpoint.load(env, path)      -- one checkpoint directory into env
--
-- Layout of DIR/step_000120/ (DIR = checkpoint.dir):
--   model.safetensors         the parameters (rank 0; every rank holds them all)
--   optim.safetensors         AdamW m.NAME / v.NAME (SGD: momentum.NAME) per parameter,
--                             step count in the metadata (rank 0). Under ZeRO-1 the ranks
--                             first put their shards' moments together (an all-reduce over
--                             the data-parallel group), so the file is the same as without
--                             it and resumes with or without ZeRO-1, on any rank count
--   shard_00003.safetensors   under tensor, pipeline or context parallelism instead of
--                             model.safetensors and optim.safetensors: the parameter slices
--                             rank 3 holds and their moments, written by the ranks of data-
--                             and context-parallel rank 0, each slice once: by the rank
--                             whose placement is primary (tetra.parallel)
--   index.json                with the shards: { tensors = { NAME = { shape = global shape,
--                             shards = { { file =, dim =, offset =, length = } } } } } for
--                             every parameter and moment (dim 0-based; a whole tensor is
--                             one shard with offset 0 and the full length of dim 0); a
--                             load assembles each rank's slices for its own layout from it,
--                             so a checkpoint written with TP=2 resumes on one process or
--                             with PP=2 (and a whole-parameter one under TP or PP)
--   loader_dp_00003.bin       the tetra.data loader state of data-parallel rank 3
--                             (binary; written by its rank of tp, cp and pp rank 0), when
--                             the data source has one (mock and byte data are functions
--                             of the step: nothing to record). A resume concatenates
--                             them all, which restores a loader of any data-parallel size
--   fp8_00003.json            rank 3's FP8 scaling state (train.precision=fp8): for each of
--                             its FP8 layers the scale, ring position and amax history of
--                             x, w and g; same layout: each rank reads its own, another
--                             layout: each layer from the lowest rank that saved it
--   state.json                step, tokens seen, engine RNG state, loss-scaler state, the
--                             data source's step, the loss guard's spike window and
--                             skipped data windows (tetra.train.guard), world size, config
--   checksums.json            { FILE = CRC-32C (8 hex digits) } of every other file: each
--                             rank sums the files it wrote, rank 0 merges them; a load
--                             checks each file before reading it and names a corrupt one
-- A save writes DIR/.tmp.step_000120/ (every file fsynced), renames it to step_000120,
-- then replaces DIR/latest (the directory name, written to a temporary file and renamed)
-- last; under MPI the ranks meet at a barrier first, so `latest` moves only once all of
-- them wrote. A crash leaves at worst a .tmp.* directory, which resume ignores and the
-- next save removes. Then all but the newest checkpoint.keep checkpoints are removed.
local ffi = require("ffi")
local C = require("tetra.ffi").C
local host = require("tetra.host")
local st = require("tetra.io")
local metrics = require("tetra.obs.metrics")
local F = require("tetra.nn.functional")

local M = {}

for _, decl in ipairs({ "int open(const char *path, int flags, ...);",
                        "int fsync(int fd);", "int close(int fd);",
                        "char *strerror(int errnum);" }) do
  pcall(ffi.cdef, decl)
end

local O_RDONLY = 0

-- A user-facing error: the tetra binary prints the message alone.
local function fail(fmt, ...)
  local msg = fmt:format(...)
  error(setmetatable({ message = msg, user = true },
                     { __tostring = function(e) return e.message end }), 0)
end

local function errno_text() return ffi.string(C.strerror(ffi.errno())) end

-- -- Files ---------------------------------------------------------------------------

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close(); return true end
  return host.is_dir(path)
end

local function fsync_path(path)
  local fd = C.open(path, O_RDONLY)
  if fd < 0 then fail("checkpoint: cannot open %s to fsync: %s", path, errno_text()) end
  local rc = C.fsync(fd)
  C.close(fd)
  if rc ~= 0 then fail("checkpoint: fsync %s: %s", path, errno_text()) end
end

local function mkdir_p(path) metrics.mkdir_p(path, "checkpoint.dir") end

local function remove_tree(path)
  if host.is_dir(path) then
    for _, name in ipairs(host.listdir(path) or {}) do remove_tree(path .. "/" .. name) end
  end
  local ok, err = os.remove(path)
  if not ok then fail("checkpoint: cannot remove %s: %s", path, tostring(err)) end
end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- Writes data to path and fsyncs it.
local function write_file(path, data)
  local f, err = io.open(path, "wb")
  if not f then fail("checkpoint: cannot write %s: %s", path, tostring(err)) end
  local ok, werr = f:write(data)
  f:close()
  if not ok then fail("checkpoint: cannot write %s: %s", path, tostring(werr)) end
  fsync_path(path)
end

-- Replaces path atomically: a temporary file beside it, fsynced, renamed over it.
local function replace_file(path, data)
  local tmp = path .. ".tmp"
  write_file(tmp, data)
  local ok, err = os.rename(tmp, path)
  if not ok then fail("checkpoint: cannot rename %s to %s: %s", tmp, path, tostring(err)) end
end

-- CRC-32C of a file, as 8 hex digits.
local crc_box = ffi.new("uint32_t[1]")
local function crc_of(path)
  if C.tt_crc32c_file(path, crc_box) ~= 0 then
    fail("checkpoint: %s", ffi.string(C.tt_last_error()))
  end
  return bit.tohex(tonumber(crc_box[0]), 8)
end

-- -- JSON (objects, arrays, strings, numbers, booleans, null) --------------------------

local function encode_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    if c == '"' or c == "\\" then return "\\" .. c end
    return string.format("\\u%04x", c:byte())
  end) .. '"'
end

local function encode(v)
  local t = type(v)
  if t == "table" then
    local parts = {}
    if #v > 0 or next(v) == nil then
      for i, x in ipairs(v) do parts[i] = encode(x) end
      return "[" .. table.concat(parts, ",") .. "]"
    end
    local keys = {}
    for k, x in pairs(v) do
      local kt = type(x)
      if kt ~= "function" and kt ~= "userdata" and kt ~= "cdata" then keys[#keys + 1] = tostring(k) end
    end
    table.sort(keys)
    for i, k in ipairs(keys) do
      parts[i] = encode_string(k) .. ":" .. encode(v[k])
    end
    return "{" .. table.concat(parts, ",") .. "}"
  elseif t == "number" and v == math.floor(v) and math.abs(v) < 2^53 then
    return string.format("%d", v)
  elseif t == "number" then
    if v ~= v or math.abs(v) == math.huge then return "null" end
    return string.format("%.17g", v)            -- round-trips a double exactly
  end
  if t == "string" then return encode_string(v) end
  if t == "boolean" then return tostring(v) end
  return "null"
end
M.encode_json = encode

local escapes = { b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

-- Parses JSON text; raises "offset N: ..." on malformed input.
function M.decode_json(s)
  local pos = 1
  local function err(what) error(("offset %d: %s"):format(pos, what), 0) end
  local function ws() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local value
  local function str()
    local out = {}
    pos = pos + 1
    while true do
      local c = s:sub(pos, pos)
      if c == "" then err("unterminated string") end
      if c == '"' then pos = pos + 1; return table.concat(out) end
      if c == "\\" then
        local e = s:sub(pos + 1, pos + 1)
        if e == "u" then
          local code = tonumber(s:sub(pos + 2, pos + 5), 16) or err("bad \\u escape")
          out[#out + 1] = code < 128 and string.char(code) or "?"
          pos = pos + 6
        else
          out[#out + 1] = escapes[e] or e
          pos = pos + 2
        end
      else
        out[#out + 1] = c
        pos = pos + 1
      end
    end
  end
  function value()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then
      local obj = {}
      pos = pos + 1; ws()
      if s:sub(pos, pos) == "}" then pos = pos + 1; return obj end
      while true do
        ws()
        if s:sub(pos, pos) ~= '"' then err("expected a key") end
        local k = str()
        ws()
        if s:sub(pos, pos) ~= ":" then err("expected ':'") end
        pos = pos + 1
        obj[k] = value()
        ws()
        local d = s:sub(pos, pos)
        pos = pos + 1
        if d == "}" then return obj end
        if d ~= "," then err("expected ',' or '}'") end
      end
    elseif c == "[" then
      local arr = {}
      pos = pos + 1; ws()
      if s:sub(pos, pos) == "]" then pos = pos + 1; return arr end
      while true do
        arr[#arr + 1] = value()
        ws()
        local d = s:sub(pos, pos)
        pos = pos + 1
        if d == "]" then return arr end
        if d ~= "," then err("expected ',' or ']'") end
      end
    elseif c == '"' then
      return str()
    end
    for word, v in pairs({ ["true"] = true, ["false"] = false, null = M.null }) do
      if s:sub(pos, pos + #word - 1) == word then pos = pos + #word; return v end
    end
    local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
    if not num or num == "" or not tonumber(num) then err("unexpected character") end
    pos = pos + #num
    return tonumber(num)
  end
  local v = value()
  ws()
  if pos <= #s then err("trailing characters") end
  return v
end
M.null = setmetatable({}, { __tostring = function() return "null" end })

-- -- RNG state as text (a uint64 does not fit a JSON number) ----------------------------

local function u64_hex(x) return bit.tohex(x, 16) end

local function hex_u64(s)
  local hi, lo = tonumber(s:sub(1, 8), 16), tonumber(s:sub(9, 16), 16)
  if #s ~= 16 or not hi or not lo then return nil end
  return ffi.new("uint64_t", hi) * 0x100000000ULL + lo
end

-- -- Layout --------------------------------------------------------------------------

function M.step_name(step) return string.format("step_%06d", step) end


-- ZeRO-1 across ranks: each rank's optimizer holds only its shards.
local function sharded(env)
  return env.ddp.shards ~= nil
end

local function world_size(env) return env.mesh.size or 1 end

local function barrier(env)
  local w = env.mesh.world
  if w and w.size > 1 then w:barrier() end
end

-- The kinds of optimizer state per parameter: { prefix, list } pairs (the lists follow
-- opt.params).
local function state_kinds(opt)
  if opt.m then return { { "m", opt.m }, { "v", opt.v } } end
  return { { "momentum", opt.buffers } }
end

-- This rank's parameters as an array of { name =, tensor =, shape = the whole
-- parameter's shape, dim =, offset =, length = (the 0-based dim and the range of it the
-- tensor holds), primary =, state = { m = tensor, v = tensor } (or momentum) }, from
-- their placements. Under ZeRO-1 each parameter's whole moments are put together from
-- the shards of every data-parallel rank (collective over that group), else they are the
-- optimizer's own tensors.
local function local_slices(env)
  local opt, entries = env.optimizer, env.par:placements()
  local out = {}
  for i, e in ipairs(entries) do
    local pl = e.placement
    out[i] = { name = pl.name, tensor = e.tensor, shape = pl.shape, dim = pl.dim,
               offset = pl.offset, length = pl.length, primary = pl.primary, state = {} }
  end
  if not sharded(env) then
    for _, kind in ipairs(state_kinds(opt)) do
      for i, t in ipairs(kind[2]) do out[i].state[kind[1]] = t end
    end
    return out
  end
  local params = {}
  for i, e in ipairs(out) do params[i] = e.tensor end
  for _, kind in ipairs(state_kinds(opt)) do
    for i, w in ipairs(env.ddp:gather_shards(kind[2], params)) do out[i].state[kind[1]] = w end
  end
  return out
end

-- The { name, tensor } entries of model.safetensors or optim.safetensors from slices.
local function model_entries(slices)
  local out = {}
  for _, e in ipairs(slices) do out[#out + 1] = { e.name, e.tensor } end
  return out
end

local function optim_entries(slices)
  local out = {}
  for _, e in ipairs(slices) do
    for _, prefix in ipairs({ "m", "v", "momentum" }) do
      if e.state[prefix] then out[#out + 1] = { prefix .. "." .. e.name, e.state[prefix] } end
    end
  end
  return out
end

-- -- Sharded layout (tensor, pipeline, context parallelism) ----------------------------

local function group_rank(g) return g and g.rank or 0 end

-- Whether parameters are split over ranks (tensor, pipeline parallelism) or held by
-- several ranks of one model replica (context parallelism): then each rank writes the
-- slices it holds, with index.json.
local function split_layout(env)
  local l = env.par.layout
  return l.tp > 1 or l.pp > 1 or l.cp > 1
end

local function shard_name(rank) return string.format("shard_%05d.safetensors", rank) end

-- This rank's shard file and its part of the index (shard_NNNNN.json, merged into
-- index.json by rank 0), appended to `files` (see plan_save) when this rank writes one.
local function shard_files(env, slices, rank, meta, files)
  local mesh = env.mesh
  if group_rank(mesh.dp) ~= 0 or group_rank(mesh.cp) ~= 0 then return end
  local file = shard_name(rank)
  local entries, index = {}, {}
  for _, e in ipairs(slices) do
    if e.primary then
      local list = { { e.name, e.tensor } }
      for _, kt in ipairs(optim_entries({ e })) do list[#list + 1] = kt end
      for _, kt in ipairs(list) do
        entries[#entries + 1] = kt
        index[kt[1]] = { shape = e.shape, shards = { { file = file, dim = e.dim,
                                                       offset = e.offset, length = e.length } } }
      end
    end
  end
  files[#files + 1] = { name = file, tensors = entries, meta = meta, summed = true }
  files[#files + 1] = { name = string.format("shard_%05d.json", rank),
                        bytes = encode(index) .. "\n" }
end

-- Rank 0, once every rank wrote: the text of index.json, merged from the
-- shard_NNNNN.json parts in tmp (which it removes).
local function merge_index(tmp)
  local parts = {}
  for _, e in ipairs(host.listdir(tmp) or {}) do
    if e:match("^shard_%d+%.json$") then parts[#parts + 1] = e end
  end
  table.sort(parts)
  local tensors = {}
  for _, part in ipairs(parts) do
    local text = read_file(tmp .. "/" .. part)
    for key, entry in pairs(M.decode_json(text)) do
      local have = tensors[key]
      if not have then
        tensors[key] = entry
      else
        for _, s in ipairs(entry.shards) do have.shards[#have.shards + 1] = s end
      end
    end
    local ok, err = os.remove(tmp .. "/" .. part)
    if not ok then fail("checkpoint: cannot remove %s: %s", part, tostring(err)) end
  end
  return encode({ format = 1, tensors = tensors }) .. "\n"
end

-- Rank 0, once every rank wrote: the text of checksums.json, merged from the
-- sums_NNNNN.json parts in tmp (which it removes) and `extra` ({ FILE = crc }).
local function merge_sums(tmp, extra)
  local sums = {}
  for _, e in ipairs(host.listdir(tmp) or {}) do
    if e:match("^sums_%d+%.json$") then
      for f, c in pairs(M.decode_json(read_file(tmp .. "/" .. e))) do sums[f] = c end
      local ok, err = os.remove(tmp .. "/" .. e)
      if not ok then fail("checkpoint: cannot remove %s: %s", e, tostring(err)) end
    end
  end
  for f, c in pairs(extra) do sums[f] = c end
  return encode(sums) .. "\n"
end

local function crc_of_string(text) return bit.tohex(tonumber(C.tt_crc32c(0, text, #text)), 8) end

-- -- Save ----------------------------------------------------------------------------

-- True when env trains some layers in FP8 (their scaling state goes in the checkpoint).
local function fp8_layers(env)
  return env.amp and env.amp.fp8_states and next(env.amp.fp8_states) ~= nil
end

-- A save in three parts, so that the middle one can run on a background thread
-- (checkpoint.async):
--   plan_save    at the step boundary, on every rank (collective: ZeRO-1 moments are put
--                together): the temporary directory and the list of files this rank
--                writes, { name =, tensors = { {NAME, tensor} }, meta = } or
--                { name =, bytes = string }, `summed` when checksums.json lists it
--   write_files  writes them (each fsynced) and returns their CRC-32C: here, or in
--                tetra.checkpoint's writer thread (engine/io/ckpt_writer.c) from host copies
--   finish_save  on every rank once every rank wrote (collective): sums_NNNNN.json, then
--                rank 0 merges the index and the checksums, renames the directory and
--                moves `latest`
local function plan_save(env)
  local ck = env.cfg.checkpoint or {}
  local dir = ck.dir
  if not dir or dir == "" then fail("checkpoint.save: set checkpoint.dir") end
  local step, rank = env.step_count, env.rank or 0
  local name = M.step_name(step)
  local plan = { dir = dir, name = name, tmp = dir .. "/.tmp." .. name,
                 final = dir .. "/" .. name, rank = rank, keep = ck.keep or 2,
                 split = split_layout(env), files = {} }
  if rank == 0 then
    mkdir_p(dir)
    if exists(plan.tmp) then remove_tree(plan.tmp) end
    mkdir_p(plan.tmp)
  end
  barrier(env)

  local opt, files = env.optimizer, plan.files
  local optim_meta = { step_count = tostring(opt.step_count),
                       kind = opt.m and "adamw" or "sgd" }
  local slices = local_slices(env)   -- collective under ZeRO-1
  if plan.split then shard_files(env, slices, rank, optim_meta, files) end
  local data_step
  if env.data.state then
    local st_, c = env.data:state(), env.mesh.coords or {}
    if (c.tp or 0) == 0 and (c.cp or 0) == 0 and (c.pp or 0) == 0 then
      files[#files + 1] = { name = string.format("loader_dp_%05d.bin", c.dp or 0),
                            bytes = st_.loader, summed = true }
    end
    data_step = st_.step
  end
  if fp8_layers(env) then
    -- Every rank writes its layers' FP8 scaling state (ranks of a data-parallel group
    -- see different data, so their amax histories differ).
    files[#files + 1] = { name = string.format("fp8_%05d.json", rank), summed = true,
                          bytes = encode(env.amp:fp8_state_dict()) .. "\n" }
  end
  if rank == 0 then
    if not plan.split then
      files[#files + 1] = { name = "model.safetensors", tensors = model_entries(slices), summed = true }
      files[#files + 1] = { name = "optim.safetensors", tensors = optim_entries(slices),
                            meta = optim_meta, summed = true }
    end
    local scaler = env.amp and env.amp.scaler
    files[#files + 1] = { name = "state.json", summed = true, bytes = encode({
      format = 1, step = step, tokens_seen = env.tokens_seen,
      rng = u64_hex(C.tt_rng_state()), world_size = world_size(env),
      zero_sharded = sharded(env), optimizer = optim_meta.kind,
      optimizer_step = opt.step_count, sharded_params = plan.split or nil,
      scaler = scaler and scaler:state_dict() or nil,
      data = data_step and { step = data_step } or nil,
      guard = env.guard and env.guard:state() or nil,
      config = env.cfg,
    }) .. "\n" }
  end
  return plan
end

local function write_files(plan)
  local crcs = {}
  for i, f in ipairs(plan.files) do
    local path = plan.tmp .. "/" .. f.name
    if f.tensors then st.save(path, f.tensors, f.meta) else write_file(path, f.bytes) end
    crcs[i] = crc_of(path)
  end
  return crcs
end

local writer_box = ffi.new("tt_ckpt_writer *[1]")
local take, pout = require("tetra.tensor").take, require("tetra.tensor").pout
local function check_io(rc)
  if rc ~= 0 then fail("checkpoint: %s", ffi.string(C.tt_last_error())) end
end

local function new_writer()
  check_io(C.tt_ckpt_writer_new(writer_box))
  return ffi.gc(writer_box[0], C.tt_ckpt_writer_free)
end

-- Waits for writer w's thread and frees it; returns the CRC-32C (8 hex digits) of each
-- queued operation that wrote a file.
local function end_writer(w, n)
  local rc = C.tt_ckpt_writer_wait(w)
  local msg = rc ~= 0 and ffi.string(C.tt_last_error())
  local crcs = {}
  for i = 1, msg and 0 or (n or 0) do
    crcs[i] = bit.tohex(tonumber(C.tt_ckpt_writer_crc(w, i - 1)), 8)
  end
  C.tt_ckpt_writer_free(ffi.gc(w, nil))
  if msg then fail("checkpoint: %s", msg) end
  return crcs
end

-- Once this rank's files are written (crcs: their CRC-32C in plan order), on every rank:
-- its checksums go to sums_NNNNN.json (a part rank 0 merges and removes: not fsynced,
-- checksums.json is), then, once every rank got there, rank 0 returns a writer queued
-- with the publishing: index.json and checksums.json written and fsynced, the directory
-- fsynced and renamed to step_NNNNNN, `latest` replaced (a temporary file renamed),
-- each rename made durable by an fsync of checkpoint.dir. Other ranks return nil.
local function publishing(env, plan, crcs)
  local sums, any = {}, false
  for i, f in ipairs(plan.files) do
    if f.summed then sums[f.name], any = crcs[i], true end
  end
  if any then
    local path = plan.tmp .. string.format("/sums_%05d.json", plan.rank)
    local f, err = io.open(path, "wb")
    if not f then fail("checkpoint: cannot write %s: %s", path, tostring(err)) end
    f:write(encode(sums), "\n")
    f:close()
  end
  barrier(env)   -- every rank's files are on disk
  if plan.rank ~= 0 then return nil end
  local tmp, final, dir = plan.tmp, plan.final, plan.dir
  local w = new_writer()
  local extra = {}
  if plan.split then
    local index = merge_index(tmp)
    extra["index.json"] = crc_of_string(index)
    check_io(C.tt_ckpt_writer_add_bytes(w, tmp .. "/index.json", index, #index))
  end
  local text = merge_sums(tmp, extra)
  check_io(C.tt_ckpt_writer_add_bytes(w, tmp .. "/checksums.json", text, #text))
  check_io(C.tt_ckpt_writer_add_fsync(w, tmp))
  if exists(final) then remove_tree(final) end
  check_io(C.tt_ckpt_writer_add_rename(w, tmp, final))
  check_io(C.tt_ckpt_writer_add_fsync(w, dir))
  local latest = plan.name .. "\n"
  check_io(C.tt_ckpt_writer_add_bytes(w, dir .. "/latest.tmp", latest, #latest))
  check_io(C.tt_ckpt_writer_add_rename(w, dir .. "/latest.tmp", dir .. "/latest"))
  check_io(C.tt_ckpt_writer_add_fsync(w, dir))
  return w
end

local function finish_save(env, plan, crcs)
  local w = publishing(env, plan, crcs)
  if w then
    check_io(C.tt_ckpt_writer_start(w))
    end_writer(w)
    M.prune(plan.dir, plan.keep, plan.name)
  end
  barrier(env)
  return plan.final
end

-- Writes checkpoint.dir/step_NNNNNN for env's current step on every rank (collective
-- under MPI). Returns the checkpoint's path. With an asynchronous save in flight, it
-- is completed first.
function M.save(env)
  M.drain(env)
  local plan = plan_save(env)
  return finish_save(env, plan, write_files(plan))
end

-- -- Asynchronous saves (checkpoint.async) ----------------------------------------------

-- A save in flight, env.ckpt_inflight: { plan =, writer =, phase = "write" (every rank's
-- thread writes its files) or "publish" (rank 0's thread renames and moves `latest`;
-- the other ranks are done with it) }.

-- Starts writing checkpoint.dir/step_NNNNNN for env's current step (collective) and
-- returns; the files are host copies of the state taken now, written by a background
-- thread while training goes on. At most one save is in flight: one still in flight is
-- completed first. M.poll at each later step boundary publishes it once every rank's
-- thread has finished; M.drain waits for it.
function M.save_async(env)
  M.drain(env)
  local plan = plan_save(env)
  local writer = new_writer()
  local copies = {}
  require("tetra.tensor").no_grad(function()
    for _, f in ipairs(plan.files) do
      local path = plan.tmp .. "/" .. f.name
      if f.tensors then
        local n = #f.tensors
        local names = ffi.new("const char *[?]", math.max(n, 1))
        local ts = ffi.new("tt_tensor *[?]", math.max(n, 1))
        for i, kt in ipairs(f.tensors) do
          -- A copy the next steps cannot change, in host memory.
          local t = kt[2]
          local host = take(t._device == C.TT_CPU and C.tt_clone(t, pout)
                            or C.tt_to_device(t, C.TT_CPU, pout))
          copies[#copies + 1] = host
          names[i - 1], ts[i - 1] = kt[1], host
        end
        local keys, mk, mv, nm = {}, nil, nil, 0
        if f.meta then
          for k in pairs(f.meta) do keys[#keys + 1] = k end
          table.sort(keys)
          nm = #keys
          mk = ffi.new("const char *[?]", math.max(nm, 1))
          mv = ffi.new("const char *[?]", math.max(nm, 1))
          for i, k in ipairs(keys) do mk[i - 1], mv[i - 1] = k, tostring(f.meta[k]) end
        end
        check_io(C.tt_ckpt_writer_add_safetensors(writer, path, names, ts, n, mk, mv, nm))
        f.tensors = nil   -- the plan outlives the step: it must not keep the state alive
      else
        check_io(C.tt_ckpt_writer_add_bytes(writer, path, f.bytes, #f.bytes))
      end
    end
  end)
  for _, t in ipairs(copies) do F.free(t) end   -- the writer holds its own references
  C.tt_ckpt_writer_set_delay_ms(writer, (env.cfg.checkpoint or {}).async_delay_ms or 0)
  check_io(C.tt_ckpt_writer_start(writer))
  env.ckpt_inflight = { plan = plan, writer = writer, phase = "write" }
end

-- Every rank's files are written: the publishing starts (collective; rank 0's thread).
local function start_publishing(env)
  local fl = env.ckpt_inflight
  local crcs = end_writer(fl.writer, #fl.plan.files)
  local w = publishing(env, fl.plan, crcs)
  if not w then
    env.ckpt_inflight = nil
    return
  end
  check_io(C.tt_ckpt_writer_start(w))
  fl.writer, fl.phase = w, "publish"
end

-- Rank 0's publishing is done: old checkpoints go.
local function end_publishing(env)
  local fl = env.ckpt_inflight
  env.ckpt_inflight = nil
  end_writer(fl.writer)
  M.prune(fl.plan.dir, fl.plan.keep, fl.plan.name)
  return fl.plan.final
end

-- At a step boundary (every rank): moves the save in flight on. While the files are
-- written, an all-reduce of a "written" flag tells when every rank's thread has
-- finished; then the publishing starts, and rank 0 ends it at a later boundary.
-- Returns the checkpoint's path once it is published, else nil.
local done_flag
function M.poll(env)
  local fl = env.ckpt_inflight
  if not fl then return nil end
  local done = C.tt_ckpt_writer_poll(fl.writer) ~= 0 and 1 or 0
  if fl.phase == "publish" then   -- rank 0 alone
    return done == 1 and end_publishing(env) or nil
  end
  local w = env.mesh.world
  if w and w.size > 1 then
    done_flag = done_flag or require("tetra.tensor").from_table({ 0 })
    C.tt_tensor_set(done_flag, 0, done)
    w:all_reduce(done_flag, "min")
    done = C.tt_tensor_get(done_flag, 0)
  end
  if done == 0 then return nil end
  start_publishing(env)
  return nil
end

-- Waits for the save in flight, if any, and publishes it (collective).
function M.drain(env)
  local fl = env.ckpt_inflight
  if not fl then return nil end
  if fl.phase == "write" then start_publishing(env) end
  if env.ckpt_inflight then end_publishing(env) end
  return fl.plan.final
end

-- Removes leftover .tmp.* directories and all but the newest `keep` step_* checkpoints
-- (keep 0: keep all), never `current`.
function M.prune(dir, keep, current)
  local steps = {}
  for _, e in ipairs(host.listdir(dir) or {}) do
    if e:match("^%.tmp%.step_%d+$") then
      remove_tree(dir .. "/" .. e)
    elseif e:match("^step_%d+$") then
      steps[#steps + 1] = e
    end
  end
  table.sort(steps, function(a, b) return tonumber(a:sub(6)) < tonumber(b:sub(6)) end)
  if keep <= 0 then return end
  for i = 1, #steps - keep do
    if steps[i] ~= current then remove_tree(dir .. "/" .. steps[i]) end
  end
end

-- -- Load ----------------------------------------------------------------------------

local function shape_text(s) return "[" .. table.concat(s, ", ") .. "]" end

-- The checksums of the checkpoint being loaded ({ FILE = crc }, from its checksums.json;
-- nil for a checkpoint written before checksums) and the files verified so far.
local sums, verified

-- Checks the file at path against its checksum, once per load.
local function verify(path)
  if not sums or verified[path] then return end
  local name = path:match("[^/]+$")
  local want = sums[name]
  if not want then fail("checkpoint: %s is not in its checkpoint's checksums.json", path) end
  local have = crc_of(path)
  if have ~= want then
    fail("checkpoint: %s is corrupt (CRC-32C %s, checksums.json says %s): resume from " ..
         "another checkpoint", path, have, want)
  end
  verified[path] = true
end

local function open_file(path)
  if not exists(path) then fail("checkpoint: %s is missing (incomplete checkpoint?)", path) end
  verify(path)
  local ok, f = pcall(st.open, path)
  if not ok then fail("checkpoint: cannot read %s: %s", path, tostring(f)) end
  return f
end

-- The tensors of checkpoint `path` as index.json lists them: { NAME = { shape =,
-- shards = {...} } }; for a checkpoint written whole by rank 0 (no index.json), one
-- whole-tensor shard per entry of model.safetensors and optim.safetensors.
local function count(v) return type(v) == "number" and v >= 0 and v == math.floor(v) and v < 2^53 end

-- What is wrong with an index.json entry ({ shape =, shards = { { file =, dim =, offset =,
-- length = } } }), or nil.
local function index_entry_problem(entry)
  if type(entry) ~= "table" or type(entry.shape) ~= "table" or type(entry.shards) ~= "table" then
    return "no shape or shards"
  end
  for _, n in ipairs(entry.shape) do
    if not count(n) then return "a bad size in its shape" end
  end
  if #entry.shape == 0 then return "an empty shape" end
  for _, sh in ipairs(entry.shards) do
    if type(sh) ~= "table" or type(sh.file) ~= "string" or not sh.file:match("^[%w_.-]+$") then
      return "a shard without a file name"
    end
    if not (count(sh.dim) and count(sh.offset) and count(sh.length)) or sh.dim >= #entry.shape or
       sh.offset + sh.length > entry.shape[sh.dim + 1] then
      return "a shard whose dim, offset or length does not fit the shape"
    end
  end
end

local function load_index(path)
  local text = read_file(path .. "/index.json")
  if text then
    verify(path .. "/index.json")
    local ok, idx = pcall(M.decode_json, text)
    if not ok or type(idx) ~= "table" or type(idx.tensors) ~= "table" then
      fail("checkpoint: %s/index.json is corrupt (%s)", path, ok and "no tensors" or tostring(idx))
    end
    for name, entry in pairs(idx.tensors) do
      local why = index_entry_problem(entry)
      if why then fail("checkpoint: %s/index.json is corrupt (tensor '%s': %s)", path, tostring(name), why) end
    end
    return idx.tensors
  end
  local tensors = {}
  for _, file in ipairs({ "model.safetensors", "optim.safetensors" }) do
    -- A weights-only checkpoint (state.json's weights_only) has no optim.safetensors.
    if file == "model.safetensors" or exists(path .. "/" .. file) then
      local f = open_file(path .. "/" .. file)
      for _, name in ipairs(f:names()) do
        local shape = f:info(name).shape
        tensors[name] = { shape = shape, shards = { { file = file, dim = 0, offset = 0,
                                                      length = shape[1] } } }
      end
      f:close()
    end
  end
  return tensors
end

-- The box { lo = {...}, hi = {...} } (per dim, 0-based bounds) that a tensor of the whole
-- shape `shape` holding [offset, offset + length) of `dim` covers.
local function box(shape, dim, offset, length)
  local lo, hi = {}, {}
  for d = 1, #shape do lo[d], hi[d] = 0, shape[d] end
  lo[dim + 1], hi[dim + 1] = offset, offset + length
  return { lo = lo, hi = hi }
end

-- t narrowed to [lo - base.lo, hi - base.lo) in every dim (a view; t itself when whole).
local function sub(t, base, lo, hi)
  local v = t
  for d = 1, #lo do
    if lo[d] ~= base.lo[d] or hi[d] ~= base.hi[d] then
      local n = F.narrow(v, d - 1, lo[d] - base.lo[d], hi[d] - lo[d])
      if v ~= t then F.free(v) end
      v = n
    end
  end
  return v
end

-- Fills t, this rank's slice e (see local_slices) of checkpoint tensor `key`, from the
-- shards that hold parts of it. files: path -> open file (a cache the caller closes).
local function assemble(path, tensors, files, key, e, t)
  local entry = tensors[key]
  if not entry then fail("checkpoint %s has no tensor '%s' (the model has it)", path, key) end
  if shape_text(entry.shape) ~= shape_text(e.shape) then
    fail("checkpoint %s: tensor '%s' has shape %s in the checkpoint but %s in the model",
         path, key, shape_text(entry.shape), shape_text(e.shape))
  end
  local want = box(e.shape, e.dim, e.offset, e.length)
  local covered, needed = 0, 1
  for d = 1, #e.shape do needed = needed * (want.hi[d] - want.lo[d]) end
  for _, s in ipairs(entry.shards) do
    local have = box(entry.shape, s.dim, s.offset, s.length)
    local lo, hi, n = {}, {}, 1
    for d = 1, #e.shape do
      lo[d] = math.max(want.lo[d], have.lo[d])
      hi[d] = math.min(want.hi[d], have.hi[d])
      n = n * math.max(0, hi[d] - lo[d])
    end
    if n > 0 then
      local file = path .. "/" .. s.file
      files[file] = files[file] or open_file(file)
      local ok, src = pcall(files[file].read, files[file], key)
      if not ok then fail("checkpoint %s: cannot read tensor '%s': %s", file, key, tostring(src)) end
      local stored, claimed = src:shape(), {}
      for d = 1, #entry.shape do claimed[d] = have.hi[d] - have.lo[d] end
      if shape_text(stored) ~= shape_text(claimed) then
        F.free(src)
        fail("checkpoint %s: tensor '%s' has shape %s in the file but %s in index.json", file,
             key, shape_text(stored), shape_text(claimed))
      end
      local from, to = sub(src, have, lo, hi), sub(t, want, lo, hi)
      require("tetra.ffi").check(C.tt_copy_(to, from))
      if from ~= src then F.free(from) end
      if to ~= t then F.free(to) end
      F.free(src)
      covered = covered + n
    end
  end
  if covered ~= needed then
    fail("checkpoint %s: the shards of tensor '%s' do not cover this rank's part of it",
         path, key)
  end
end

-- Loads this rank's parameters and optimizer state, in its own layout, from the shards
-- (or the whole tensors) of checkpoint `path`, whatever layout wrote them. Under ZeRO-1
-- each parameter's whole moments are read, then this rank's shards of them kept.
local function load_state(env, path)
  local tensors, opt, files = load_index(path), env.optimizer, {}
  local kinds, zero = state_kinds(opt), sharded(env)
  local zeros = require("tetra.optim").state_like
  local entries = env.par:placements()
  if env.par.layout.pp == 1 then   -- every parameter of the model is on this rank
    local known = {}
    for _, e in ipairs(entries) do
      known[e.placement.name] = true
      for _, kind in ipairs(kinds) do known[kind[1] .. "." .. e.placement.name] = true end
    end
    for name in pairs(tensors) do
      if not known[name] then
        fail("checkpoint %s: tensor '%s' is not in the model or its optimizer state (a " ..
             "different model or optimizer?)", path, name)
      end
    end
  end
  require("tetra.tensor").no_grad(function()
    local whole = {}
    local T = require("tetra.tensor")
    for i, e in ipairs(entries) do
      local pl = e.placement
      assemble(path, tensors, files, pl.name, pl, e.tensor)
      local total = T.sum(e.tensor)   -- NaN or Inf anywhere makes the sum so
      local v = total:item()
      F.free(total)
      if v ~= v or v == math.huge or v == -math.huge then
        fail("checkpoint %s: parameter '%s' holds NaN or Inf values (a corrupt or diverged " ..
             "checkpoint); resume from an earlier one", path, pl.name)
      end
      for _, kind in ipairs(kinds) do
        local target = zero and zeros(e.tensor) or kind[2][i]
        assemble(path, tensors, files, kind[1] .. "." .. pl.name, pl, target)
        whole[kind[1]] = whole[kind[1]] or {}
        whole[kind[1]][i] = target
      end
    end
    if not zero then return end
    for _, kind in ipairs(kinds) do env.ddp:scatter_to_shards(whole[kind[1]], kind[2]) end
  end)
  for _, f in pairs(files) do f:close() end
end

-- The newest complete checkpoint (step_* with a state.json) in directory dir, or nil.
local function newest_complete(dir)
  local best, best_step
  for _, e in ipairs(host.listdir(dir) or {}) do
    local n = tonumber(e:match("^step_(%d+)$"))
    if n and exists(dir .. "/" .. e .. "/state.json") and (not best_step or n > best_step) then
      best, best_step = dir .. "/" .. e, n
    end
  end
  return best
end

-- The checkpoint dir/latest names; when it names nothing complete, an error that says
-- which complete checkpoint exists and how to resume from it.
local function follow_latest(dir, latest)
  local path = dir .. "/" .. latest:gsub("%s+$", "")
  if exists(path .. "/state.json") then return path end
  local other = newest_complete(dir)
  fail("checkpoint: %s/latest names %s, which is %s; %s", dir, path,
       host.is_dir(path) and "incomplete (no state.json)" or "missing",
       other and ("the newest complete checkpoint is " .. other ..
                  ": resume from it with --set checkpoint.resume=" .. other)
             or "there is no complete checkpoint in " .. dir)
end

-- The checkpoint directory `path` names: itself, or the one its `latest` file names.
local function resolve(path)
  if not exists(path .. "/state.json") then
    local latest = read_file(path .. "/latest")
    if latest then return follow_latest(path, latest) end
  end
  return path
end

-- Loads the checkpoint directory `path` into env (model, optimizer, step, tokens seen,
-- RNG, loss scaler, data source); the next env.step() is the step after the saved one.
-- Opens checkpoint `path` (or the one its latest names) as far as no model is needed:
-- its checksums, its state.json (verified and parsed) and every file the checksums list
-- present. Returns the resolved path and the state. A load starts here, and
-- M.precheck runs it before a model is built.
local function open_checkpoint(path)
  path = resolve(path)
  if not host.is_dir(path) then fail("checkpoint: %s is not a checkpoint directory (missing)", path) end
  local sums_text = read_file(path .. "/checksums.json")
  sums, verified = nil, {}
  if sums_text then
    local ok, t = pcall(M.decode_json, sums_text)
    if not ok or type(t) ~= "table" then fail("checkpoint: %s/checksums.json is corrupt", path) end
    sums = t
    for name in pairs(sums) do
      if type(name) ~= "string" or not exists(path .. "/" .. name) then
        fail("checkpoint: %s/%s is missing (incomplete checkpoint?)", path, tostring(name))
      end
    end
  end
  local text = read_file(path .. "/state.json")
  if not text then fail("checkpoint: %s/state.json is missing (incomplete checkpoint?)", path) end
  verify(path .. "/state.json")
  local ok, state = pcall(M.decode_json, text)
  if not ok or type(state) ~= "table" or type(state.step) ~= "number" or type(state.rng) ~= "string" then
    fail("checkpoint: %s/state.json is corrupt (%s)", path, ok and "no step or rng" or tostring(state))
  end
  return path, state
end

-- open_checkpoint for a resume, which a weights-only checkpoint cannot serve.
local function open_resumable(path)
  local state
  path, state = open_checkpoint(path)
  if state.weights_only then
    fail("checkpoint %s holds weights only (no optimizer, RNG or data state: converted " ..
         "from Hugging Face?): start training from it with --set model.init_from=%s, " ..
         "not checkpoint.resume", path, path)
  end
  return path, state
end

-- The checks of the checkpoint checkpoint.resume names that need no model (tetra.train
-- runs them before building one): one line for a missing, incomplete or corrupt one.
function M.precheck(cfg)
  local path = M.resume_path(cfg)
  if path then open_resumable(path) end
end

-- Restores the FP8 scaling state of env's layers from checkpoint `path`: this rank's own
-- fp8_RRRRR.json when the checkpoint was written by as many ranks, otherwise (another
-- layout) each layer's state from the lowest rank that saved it.
local function load_fp8(env, path, state)
  local names = {}
  for _, e in ipairs(host.listdir(path) or {}) do
    if e:match("^fp8_%d+%.json$") then names[#names + 1] = e end
  end
  table.sort(names)
  if #names == 0 then
    if (env.rank or 0) == 0 then
      io.stderr:write("checkpoint: ", path, " has no FP8 scaling state (saved in another ",
                      "precision): the amax histories start empty\n")
    end
    return
  end
  local own = string.format("fp8_%05d.json", env.rank or 0)
  if state.world_size == world_size(env) and exists(path .. "/" .. own) then names = { own } end
  local merged = {}
  for i = #names, 1, -1 do   -- the lowest rank last, so its entries win
    verify(path .. "/" .. names[i])
    local ok, d = pcall(M.decode_json, read_file(path .. "/" .. names[i]))
    if not ok or type(d) ~= "table" then fail("checkpoint: %s/%s is corrupt", path, names[i]) end
    for layer, e in pairs(d) do merged[layer] = e end
  end
  env.amp:load_fp8_state_dict(merged, function(layer)
    fail("checkpoint %s holds no FP8 scaling state for layer %s (train.fp8_layers differs " ..
         "from the saved run's?)", path, layer)
  end)
end
function M.load(env, path)
  local state
  path, state = open_resumable(path)
  -- A captured step (train.cuda_graphs) read the tensors the load may replace: the next
  -- step captures again.
  if env.drop_graph then env.drop_graph() end
  local opt = env.optimizer
  if state.optimizer ~= (opt.m and "adamw" or "sgd") then
    fail("checkpoint %s holds %s state but the optimizer is %s", path, tostring(state.optimizer),
         opt.m and "adamw" or "sgd")
  end
  load_state(env, path)
  opt.step_count = tonumber(state.optimizer_step) or state.step

  local scaler = env.amp and env.amp.scaler
  if scaler and type(state.scaler) == "table" then scaler:load_state_dict(state.scaler) end
  if fp8_layers(env) then load_fp8(env, path, state) end
  C.tt_rng_set_state(hex_u64(state.rng) or fail("checkpoint: %s/state.json: bad rng state", path))
  if env.data.load_state then
    if type(state.data) ~= "table" then
      fail("checkpoint %s has no data-loader state but this run's data source needs one", path)
    end
    local names = {}
    for _, e in ipairs(host.listdir(path) or {}) do
      if e:match("^loader_dp_%d+%.bin$") then names[#names + 1] = e end
    end
    table.sort(names)
    if #names == 0 then fail("checkpoint %s has no loader_dp_*.bin files", path) end
    local blobs = {}
    for i, name in ipairs(names) do
      verify(path .. "/" .. name)
      blobs[i] = read_file(path .. "/" .. name)
    end
    env.data:load_state({ step = state.data.step, loader = table.concat(blobs) })
  end
  if env.guard then env.guard:load_state(state.guard) end
  env.step_count = state.step
  env.tokens_seen = state.tokens_seen or 0
  if type(env.ddp.step) == "number" then env.ddp.step = state.step end
  env.resumed_from = path
  return path
end

-- -- Weights alone (tetra convert, model.init_from) -----------------------------------

-- Opens the parameters of checkpoint `path` (or the one its latest names), whatever
-- layout wrote them, checksums verified. Returns { path =, state = (state.json), names =
-- (sorted parameter names, no optimizer moments), shape = fn(name) -> the whole shape,
-- read = fn(name) -> the whole parameter as a new tensor, close = fn() }.
function M.open_weights(path)
  local state
  path, state = open_checkpoint(path)
  local tensors = load_index(path)
  local names, moments = {}, { m = true, v = true, momentum = true }
  for name in pairs(tensors) do
    if not moments[name:match("^([%w_]+)%.") or ""] then names[#names + 1] = name end
  end
  table.sort(names)
  local files, T = {}, require("tetra.tensor")
  local w = { path = path, state = state, names = names }
  function w.shape(name)
    local e = tensors[name]
    return e and e.shape
  end
  function w.read(name)
    local e = tensors[name]
    if not e then fail("checkpoint %s has no tensor '%s'", path, name) end
    local t = T.empty(e.shape)
    T.no_grad(function()
      assemble(path, tensors, files, name,
               { shape = e.shape, dim = 0, offset = 0, length = e.shape[1] }, t)
    end)
    return t
  end
  function w.close()
    for _, f in pairs(files) do f:close() end
    files = {}
  end
  return w
end

-- Writes a checkpoint directory `path` that holds weights only: model.safetensors
-- (entries: an array of { name, tensor }), state.json (step 0, weights_only, `config`)
-- and checksums.json, through a temporary directory renamed into place. Training starts
-- from it with model.init_from (fresh optimizer, RNG from train.seed); checkpoint.resume
-- refuses it.
function M.save_weights(path, entries, config, origin)
  if exists(path) then fail("%s already exists: choose a new output directory", path) end
  local tmp = path .. ".tmp"
  if exists(tmp) then remove_tree(tmp) end
  mkdir_p(tmp)
  st.save(tmp .. "/model.safetensors", entries)
  write_file(tmp .. "/state.json", encode({ format = 1, step = 0, tokens_seen = 0,
    weights_only = true, rng = u64_hex(C.tt_rng_state()), origin = origin,
    config = config }) .. "\n")
  local sums = {}
  for _, f in ipairs({ "model.safetensors", "state.json" }) do sums[f] = crc_of(tmp .. "/" .. f) end
  write_file(tmp .. "/checksums.json", encode(sums) .. "\n")
  fsync_path(tmp)
  local ok, err = os.rename(tmp, path)
  if not ok then fail("checkpoint: cannot rename %s to %s: %s", tmp, path, tostring(err)) end
  return path
end

M.mkdir_p = mkdir_p
M.remove_tree = remove_tree
M.write_file = write_file
M.exists = exists
M.fail = fail
M.read_file = read_file

-- The checkpoint checkpoint.resume asks for: true / "auto" -> checkpoint.dir/latest
-- (nil when there is none yet: a fresh start); a path -> that checkpoint (or the
-- latest of the checkpoint directory it names); false / nil -> nil.
function M.resume_path(cfg)
  local ck = cfg.checkpoint or {}
  local r = ck.resume
  if r == nil or r == false or r == "" or r == "false" then return nil end
  if r == true or r == "auto" or r == "true" then
    if not ck.dir or ck.dir == "" then fail("checkpoint.resume=%s needs checkpoint.dir", tostring(r)) end
    local latest = read_file(ck.dir .. "/latest")
    if not latest then return nil end
    return follow_latest(ck.dir, latest)
  end
  if type(r) ~= "string" then fail("checkpoint.resume must be true, \"auto\" or a path, got %s", tostring(r)) end
  return r
end

-- Loads the checkpoint checkpoint.resume asks for into env, if any; returns its path.
function M.resume(env)
  local path = M.resume_path(env.cfg)
  if path then return M.load(env, path) end
  return nil
end

-- Whether train.run saves after `step` of `total`: every checkpoint.every steps and at
-- the last step (with checkpoint.dir set and every > 0).
function M.due(cfg, step, total)
  local ck = cfg.checkpoint or {}
  local every = ck.every or 0
  if not ck.dir or ck.dir == "" or every <= 0 then return false end
  return step % every == 0 or step == total
end

-- A resumed run keeps the metrics records of the steps up to the checkpoint (later ones
-- were lost with the run that wrote them): those of path with step <= step.
function M.metrics_before(path, step)
  if not path or path == "" or not exists(path) then return {} end
  local kept = {}
  for _, r in ipairs(metrics.read(path)) do
    if r.step and r.step <= step then kept[#kept + 1] = r end
  end
  return kept
end

return M
