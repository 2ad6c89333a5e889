-- tetra.checkpoint: save and resume the whole training state.
--
--   checkpoint.save(env)            -- DIR/step_NNNNNN/ for env.step_count, then DIR/latest
--   checkpoint.resume(env)          -- per checkpoint.resume; returns the path loaded or nil
--   checkpoint.load(env, path)      -- one checkpoint directory into env
--
-- Layout of DIR/step_000120/ (DIR = checkpoint.dir):
--   model.safetensors         the parameters (rank 0; every rank holds them all)
--   optim.safetensors         AdamW m / v (SGD: momentum buffers) per parameter, step count
--                             in the metadata (rank 0; not under ZeRO-1)
--   rank_00003.safetensors    under ZeRO-1: rank 3's moments for the parameter shards it
--                             owns (resume needs the same layout)
--   rank_00003.loader         the tetra.data loader state of rank 3 (binary), when the
--                             data source has one (mock and byte data are functions of
--                             the step: nothing to record)
--   state.json                step, tokens seen, engine RNG state, loss-scaler state, the
--                             data source's step, world size, config snapshot
-- A save writes DIR/.tmp.step_000120/ (every file fsynced), renames it to step_000120,
-- then replaces DIR/latest (the directory name, written to a temporary file and renamed)
-- last; under MPI the ranks meet at a barrier first, so `latest` moves only once all of
-- them wrote. A crash leaves at worst a .tmp.* directory, which resume ignores and the
-- next save removes. Then all but the newest checkpoint.keep checkpoints are removed.
local ffi = require("ffi")
local C = require("tetra.ffi").C
local host = require("tetra.host")
local st = require("tetra.io")
local metrics = require("tetra.metrics")

local M = {}

for _, decl in ipairs({ "int mkdir(const char *path, unsigned int mode);",
                        "int open(const char *path, int flags, ...);",
                        "int fsync(int fd);", "int close(int fd);",
                        "char *strerror(int errnum);" }) do
  pcall(ffi.cdef, decl)
end

local O_RDONLY, EEXIST = 0, 17

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

local function mkdir_p(path)
  local prefix = path:sub(1, 1) == "/" and "" or "."
  for part in path:gmatch("[^/]+") do
    prefix = prefix .. "/" .. part
    if C.mkdir(prefix, 493) ~= 0 and ffi.errno() ~= EEXIST then   -- 0755
      fail("checkpoint: cannot create directory %s: %s", prefix, errno_text())
    end
  end
end

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

local function rank_file(dir, rank, ext) return string.format("%s/rank_%05d.%s", dir, rank, ext) end

-- ZeRO-1 across ranks: each rank's optimizer holds only its shards.
local function sharded(env)
  return rawget(env.ddp, "_shards") ~= nil
end

local function world_size(env) return env.mesh.size or 1 end

local function barrier(env)
  local w = env.mesh.world
  if w and w.size > 1 then w:barrier() end
end

-- Names for the optimizer's state tensors, unique even where two ZeRO-1 shards come from
-- one parameter: "m.NAME", "v.NAME" (AdamW) or "momentum.NAME" (SGD).
local function optim_entries(opt)
  local seen, out = {}, {}
  for i, name in ipairs(opt.names) do
    local key = name
    if seen[key] then
      seen[name] = seen[name] + 1
      key = name .. "#" .. seen[name]
    else
      seen[key] = 0
    end
    if opt.m then
      out[#out + 1] = { "m." .. key, opt.m[i] }
      out[#out + 1] = { "v." .. key, opt.v[i] }
    else
      out[#out + 1] = { "momentum." .. key, opt.buffers[i] }
    end
  end
  return out
end

-- -- Save ----------------------------------------------------------------------------

-- Writes checkpoint.dir/step_NNNNNN for env's current step on every rank (collective
-- under MPI). Returns the checkpoint's path.
function M.save(env)
  local ck = env.cfg.checkpoint or {}
  local dir = ck.dir
  if not dir or dir == "" then fail("checkpoint.save: set checkpoint.dir") end
  local step, rank = env.step_count, env.rank or 0
  local name = M.step_name(step)
  local tmp, final = dir .. "/.tmp." .. name, dir .. "/" .. name
  if rank == 0 then
    mkdir_p(dir)
    if exists(tmp) then remove_tree(tmp) end
    mkdir_p(tmp)
  end
  barrier(env)

  local opt = env.optimizer
  local optim_meta = { step_count = tostring(opt.step_count),
                       kind = opt.m and "adamw" or "sgd" }
  if sharded(env) then
    st.save(rank_file(tmp, rank, "safetensors"), optim_entries(opt), optim_meta)
  end
  local data_step
  if env.data.state then
    local s = env.data:state()
    write_file(rank_file(tmp, rank, "loader"), s.loader)
    data_step = s.step
  end
  if rank == 0 then
    st.save(tmp .. "/model.safetensors", env.model:named_parameters())
    if not sharded(env) then st.save(tmp .. "/optim.safetensors", optim_entries(opt), optim_meta) end
    local scaler = env.amp and env.amp.scaler
    write_file(tmp .. "/state.json", encode({
      format = 1, step = step, tokens_seen = env.tokens_seen,
      rng = u64_hex(C.tt_rng_state()), world_size = world_size(env),
      zero_sharded = sharded(env), optimizer = optim_meta.kind,
      scaler = scaler and scaler:state_dict() or nil,
      data = data_step and { step = data_step } or nil,
      config = env.cfg,
    }) .. "\n")
  end
  barrier(env)   -- every rank's files are on disk

  if rank == 0 then
    fsync_path(tmp)
    if exists(final) then remove_tree(final) end
    local ok, err = os.rename(tmp, final)
    if not ok then fail("checkpoint: cannot rename %s to %s: %s", tmp, final, tostring(err)) end
    fsync_path(dir)
    replace_file(dir .. "/latest", name .. "\n")
    fsync_path(dir)
    M.prune(dir, ck.keep or 2, name)
  end
  barrier(env)
  return final
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

local function tensor_shape(t)
  local s = {}
  for d = 0, t._ndim - 1 do s[d + 1] = tonumber(t._shape[d]) end
  return s
end

local function open_file(path)
  if not exists(path) then fail("checkpoint: %s is missing (incomplete checkpoint?)", path) end
  local ok, f = pcall(st.open, path)
  if not ok then fail("checkpoint: cannot read %s: %s", path, tostring(f)) end
  return f
end

-- Reads every entry ({ name, tensor } pairs) from the safetensors file at path into its
-- tensor, after checking that the file holds exactly these names with the same shapes.
local function read_entries(path, entries, what)
  local f = open_file(path)
  local wanted = {}
  for _, e in ipairs(entries) do
    local name, t = e[1], e[2]
    wanted[name] = true
    if not f:has(name) then
      f:close()
      fail("checkpoint %s has no tensor '%s' (the %s has it)", path, name, what)
    end
    local have, want = f:info(name).shape, tensor_shape(t)
    if shape_text(have) ~= shape_text(want) then
      f:close()
      fail("checkpoint %s: tensor '%s' has shape %s in the checkpoint but %s in the %s",
           path, name, shape_text(have), shape_text(want), what)
    end
  end
  for _, name in ipairs(f:names()) do
    if not wanted[name] then
      f:close()
      fail("checkpoint %s: tensor '%s' is not in the %s (a different model?)", path, name, what)
    end
  end
  for _, e in ipairs(entries) do
    local ok, err = pcall(f.read_into, f, e[1], e[2])
    if not ok then
      f:close()
      fail("checkpoint %s: cannot read tensor '%s': %s", path, e[1], tostring(err))
    end
  end
  local meta = f:metadata()
  f:close()
  return meta
end

-- The checkpoint directory `path` names: itself, or the one its `latest` file names.
local function resolve(path)
  if not exists(path .. "/state.json") then
    local latest = read_file(path .. "/latest")
    if latest then return path .. "/" .. latest:gsub("%s+$", "") end
  end
  return path
end

-- Loads the checkpoint directory `path` into env (model, optimizer, step, tokens seen,
-- RNG, loss scaler, data source); the next env.step() is the step after the saved one.
function M.load(env, path)
  path = resolve(path)
  if not host.is_dir(path) then fail("checkpoint: %s is not a checkpoint directory (missing)", path) end
  local text = read_file(path .. "/state.json")
  if not text then fail("checkpoint: %s/state.json is missing (incomplete checkpoint?)", path) end
  local ok, state = pcall(M.decode_json, text)
  if not ok or type(state) ~= "table" or type(state.step) ~= "number" or type(state.rng) ~= "string" then
    fail("checkpoint: %s/state.json is corrupt (%s)", path, ok and "no step or rng" or tostring(state))
  end
  local rank = env.rank or 0
  if state.zero_sharded ~= sharded(env) or (state.zero_sharded and state.world_size ~= world_size(env)) then
    fail("checkpoint %s was written %s on %d ranks; this run %s on %d ranks: resume with the same layout",
         path, state.zero_sharded and "with ZeRO-1" or "without ZeRO-1", state.world_size,
         sharded(env) and "uses ZeRO-1" or "does not use ZeRO-1", world_size(env))
  end
  local opt = env.optimizer
  if state.optimizer ~= (opt.m and "adamw" or "sgd") then
    fail("checkpoint %s holds %s state but the optimizer is %s", path, tostring(state.optimizer),
         opt.m and "adamw" or "sgd")
  end

  read_entries(path .. "/model.safetensors", env.model:named_parameters(), "model")
  local opt_path = sharded(env) and rank_file(path, rank, "safetensors") or path .. "/optim.safetensors"
  local meta = read_entries(opt_path, optim_entries(opt), "optimizer")
  opt.step_count = tonumber(meta.step_count) or state.step

  local scaler = env.amp and env.amp.scaler
  if scaler and type(state.scaler) == "table" then scaler:load_state_dict(state.scaler) end
  C.tt_rng_set_state(hex_u64(state.rng) or fail("checkpoint: %s/state.json: bad rng state", path))
  if env.data.load_state then
    if type(state.data) ~= "table" then
      fail("checkpoint %s has no data-loader state but this run's data source needs one", path)
    end
    local blob = read_file(rank_file(path, rank, "loader"))
    if not blob then fail("checkpoint: %s is missing", rank_file(path, rank, "loader")) end
    env.data:load_state({ step = state.data.step, loader = blob })
  end
  env.step_count = state.step
  env.tokens_seen = state.tokens_seen or 0
  if type(env.ddp.step) == "number" then env.ddp.step = state.step end
  env.resumed_from = path
  return path
end

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
    return ck.dir .. "/" .. latest:gsub("%s+$", "")
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
