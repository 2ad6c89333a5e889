-- tetra.checkpoint.dir: one checkpoint directory on disk, as tetra.checkpoint reads it:
-- its name, its checksums (checksums.json, checked before a file is read), the one a
-- checkpoint.dir's `latest` names, and the pruning of old ones.
local ffi = require("ffi")
local C = require("tetra.ffi").C
local st = require("tetra.io")
local fs = require("tetra.util.fs")
local json = require("tetra.util.json")
local fail = require("tetra.util.errors").raise

local M = {}

function M.step_name(step) return string.format("step_%06d", step) end

-- -- Checksums ---------------------------------------------------------------------------

-- CRC-32C of a file, as 8 hex digits.
local crc_box = ffi.new("uint32_t[1]")
function M.crc_of(path)
  if C.tt_crc32c_file(path, crc_box) ~= 0 then
    fail("checkpoint: %s", ffi.string(C.tt_last_error()))
  end
  return bit.tohex(tonumber(crc_box[0]), 8)
end

function M.crc_of_string(text) return bit.tohex(tonumber(C.tt_crc32c(0, text, #text)), 8) end

local function file_size(path)
  local f = io.open(path, "rb")
  if not f then fail("checkpoint: cannot open %s", path) end
  local size = f:seek("end")
  f:close()
  return size
end

-- checksums.json's entry for a safetensors file: { crc = the whole file's, block = bytes
-- (tt_checksum_block), blocks = the CRC-32C of each block, 8 hex digits each, in one
-- string }: a load sums only the blocks it reads (under ZeRO a rank reads 1/dp of each
-- file). block_entry makes it from sums taken as the file was written (a uint32_t[n]).
function M.block_entry(crc, block, sums, n)
  local hex = {}
  for k = 0, n - 1 do hex[k + 1] = bit.tohex(tonumber(sums[k]), 8) end
  return { crc = crc, block = tonumber(block), blocks = table.concat(hex) }
end

-- Writes a safetensors file (tetra.io.save's path, tensors, metadata), summed on its way
-- to the file, and returns its checksums.json entry (reading it back to sum it would read
-- every byte again).
function M.save_summed(path, tensors, metadata)
  local s = ffi.new("tt_file_sums")
  st.save(path, tensors, metadata, s)
  local entry = M.block_entry(bit.tohex(tonumber(s.crc), 8), s.block, s.sums, tonumber(s.n_blocks))
  C.tt_file_sums_free(s)
  return entry
end

-- The checksums of the checkpoint being loaded ({ FILE = crc, or a block_sums entry },
-- from its checksums.json; nil for a checkpoint written before checksums), the files
-- verified whole so far and, per file, the blocks verified so far.
local sums, verified, blocks_seen

-- Reading files of a folder that has no checksums (a Hugging Face one): nothing to check.
function M.without_checksums()
  sums, verified, blocks_seen = nil, {}, {}
end

-- One line for a file that fails its check.
local function corrupt(path, what, have, want)
  fail("checkpoint: %s is corrupt (CRC-32C %s%s, checksums.json says %s): resume from " ..
       "another checkpoint", path, have, what, want)
end

-- path's entry in checksums.json.
local function entry_of(path)
  local name = path:match("[^/]+$")
  local want = sums[name]
  if not want then fail("checkpoint: %s is not in its checkpoint's checksums.json", path) end
  return want
end

-- Checks the file at path against its checksum, once per load.
function M.verify(path)
  if not sums or verified[path] then return end
  local want = entry_of(path)
  if type(want) == "table" then want = want.crc end
  local have = M.crc_of(path)
  if have ~= want then corrupt(path, "", have, want) end
  verified[path] = true
end

-- Checks bytes [begin, end) of the file at path: the blocks that hold them, each once
-- per load, when checksums.json has block sums for it; else the whole file.
function M.verify_span(path, begin, finish)
  if not sums or verified[path] then return end
  local want = entry_of(path)
  if type(want) ~= "table" then return M.verify(path) end
  local block, hex = want.block, want.blocks
  local seen = blocks_seen[path]
  if not seen then
    seen = { size = file_size(path) }
    if #hex / 8 ~= math.ceil(seen.size / block) then
      fail("checkpoint: %s is corrupt (%d bytes, where checksums.json sums %d blocks of %d): " ..
           "resume from another checkpoint", path, seen.size, #hex / 8, block)
    end
    blocks_seen[path] = seen
  end
  finish = math.min(math.max(finish, begin + 1), seen.size)
  for k = math.floor(begin / block), math.floor((finish - 1) / block) do
    if not seen[k] then
      local from = k * block
      local len = math.min(block, seen.size - from)
      if C.tt_crc32c_file_range(path, from, len, crc_box) ~= 0 then
        fail("checkpoint: %s", ffi.string(C.tt_last_error()))
      end
      local have, expect = bit.tohex(tonumber(crc_box[0]), 8), hex:sub(8 * k + 1, 8 * k + 8)
      if have ~= expect then
        corrupt(path, string.format(" of bytes %d to %d", from, from + len - 1), have, expect)
      end
      seen[k] = true
    end
  end
end

-- A safetensors file of the checkpoint being loaded, open for reading: its header
-- verified (with block sums; else the whole file). Read its tensors' bytes through
-- M.read_box, which verifies them.
function M.open_safetensors(path)
  if not fs.exists(path) then fail("checkpoint: %s is missing (incomplete checkpoint?)", path) end
  local want = sums and sums[path:match("[^/]+$")]
  if type(want) == "table" and want.blocks then
    local f = io.open(path, "rb")
    local head = f and f:read(8) or ""
    if f then f:close() end
    local n = 0
    for i = 8, 1, -1 do n = n * 256 + (head:byte(i) or 0) end
    M.verify_span(path, 0, 8 + math.min(n, 2^52))
  else
    M.verify(path)
  end
  local ok, f = pcall(st.open, path)
  if not ok then fail("checkpoint: cannot read %s: %s", path, tostring(f)) end
  return f
end

-- Copies the box [lo, hi) (0-based bounds per dim) of tensor `name` of f, a file
-- M.open_safetensors opened, into t, once the file's bytes that hold it are verified.
function M.read_box(f, name, lo, hi, t)
  local ok, err = pcall(function()
    local b, e = f:box_span(name, lo, hi)
    M.verify_span(f.path, b, e)
    f:read_box(name, lo, hi, t)
  end)
  if not ok then
    if type(err) == "table" then error(err, 0) end   -- a checksum's own error
    fail("checkpoint %s: cannot read tensor '%s': %s", f.path, name, tostring(err))
  end
end

-- -- Finding a checkpoint ------------------------------------------------------------------

-- The newest complete checkpoint (step_* with a state.json) in directory dir, or nil.
local function newest_complete(dir)
  local best, best_step
  for _, e in ipairs(fs.listdir(dir) or {}) do
    local n = tonumber(e:match("^step_(%d+)$"))
    if n and fs.exists(dir .. "/" .. e .. "/state.json") and (not best_step or n > best_step) then
      best, best_step = dir .. "/" .. e, n
    end
  end
  return best
end

-- The checkpoint dir/latest names; when it names nothing complete, an error that says
-- which complete checkpoint exists and how to resume from it.
function M.follow_latest(dir, latest)
  local path = dir .. "/" .. latest:gsub("%s+$", "")
  if fs.exists(path .. "/state.json") then return path end
  local other = newest_complete(dir)
  fail("checkpoint: %s/latest names %s, which is %s; %s", dir, path,
       fs.is_dir(path) and "incomplete (no state.json)" or "missing",
       other and ("the newest complete checkpoint is " .. other ..
                  ": resume from it with --set checkpoint.resume=" .. other)
             or "there is no complete checkpoint in " .. dir)
end

-- The checkpoint directory `path` names: itself, or the one its `latest` file names.
local function resolve(path)
  if not fs.exists(path .. "/state.json") then
    local latest = fs.read_file(path .. "/latest")
    if latest then return M.follow_latest(path, latest) end
  end
  return path
end

-- Opens checkpoint `path` (or the one its latest names) as far as no model is needed:
-- its checksums, its state.json (verified and parsed) and every file the checksums list
-- present. Returns the resolved path and the state. A load starts here (the checksums
-- M.verify checks against are this checkpoint's from now on).
function M.open(path)
  path = resolve(path)
  if not fs.is_dir(path) then fail("checkpoint: %s is not a checkpoint directory (missing)", path) end
  local sums_text = fs.read_file(path .. "/checksums.json")
  sums, verified, blocks_seen = nil, {}, {}
  if sums_text then
    local ok, t = pcall(json.decode, sums_text)
    if not ok or type(t) ~= "table" then fail("checkpoint: %s/checksums.json is corrupt", path) end
    sums = t
    for name, want in pairs(sums) do
      if type(name) ~= "string" or not fs.exists(path .. "/" .. name) then
        fail("checkpoint: %s/%s is missing (incomplete checkpoint?)", path, tostring(name))
      end
      local bad = type(want) ~= "string"
      if type(want) == "table" then
        bad = type(want.crc) ~= "string" or type(want.block) ~= "number" or want.block < 1 or
              type(want.blocks) ~= "string" or #want.blocks % 8 ~= 0
      end
      if bad then fail("checkpoint: %s/checksums.json is corrupt (entry %s)", path, name) end
    end
  end
  local text = fs.read_file(path .. "/state.json")
  if not text then fail("checkpoint: %s/state.json is missing (incomplete checkpoint?)", path) end
  M.verify(path .. "/state.json")
  local ok, state = pcall(json.decode, text)
  if not ok or type(state) ~= "table" or type(state.step) ~= "number" or type(state.rng) ~= "string" then
    fail("checkpoint: %s/state.json is corrupt (%s)", path, ok and "no step or rng" or tostring(state))
  end
  return path, state
end

-- -- Pruning -------------------------------------------------------------------------------

-- Removes leftover .tmp.* directories and all but the newest `keep` step_* checkpoints
-- (keep 0: keep all), never `current`.
function M.prune(dir, keep, current)
  local steps = {}
  for _, e in ipairs(fs.listdir(dir) or {}) do
    if e:match("^%.tmp%.step_%d+$") then
      fs.remove_tree(dir .. "/" .. e, "checkpoint")
    elseif e:match("^step_%d+$") then
      steps[#steps + 1] = e
    end
  end
  table.sort(steps, function(a, b) return tonumber(a:sub(6)) < tonumber(b:sub(6)) end)
  if keep <= 0 then return end
  for i = 1, #steps - keep do
    if steps[i] ~= current then fs.remove_tree(dir .. "/" .. steps[i], "checkpoint") end
  end
end

return M
