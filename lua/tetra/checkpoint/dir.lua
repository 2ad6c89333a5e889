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

-- The checksums of the checkpoint being loaded ({ FILE = crc }, from its checksums.json;
-- nil for a checkpoint written before checksums) and the files verified so far.
local sums, verified

-- Checks the file at path against its checksum, once per load.
function M.verify(path)
  if not sums or verified[path] then return end
  local name = path:match("[^/]+$")
  local want = sums[name]
  if not want then fail("checkpoint: %s is not in its checkpoint's checksums.json", path) end
  local have = M.crc_of(path)
  if have ~= want then
    fail("checkpoint: %s is corrupt (CRC-32C %s, checksums.json says %s): resume from " ..
         "another checkpoint", path, have, want)
  end
  verified[path] = true
end

-- A safetensors file of the checkpoint being loaded, verified, open for reading.
function M.open_safetensors(path)
  if not fs.exists(path) then fail("checkpoint: %s is missing (incomplete checkpoint?)", path) end
  M.verify(path)
  local ok, f = pcall(st.open, path)
  if not ok then fail("checkpoint: cannot read %s: %s", path, tostring(f)) end
  return f
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
  sums, verified = nil, {}
  if sums_text then
    local ok, t = pcall(json.decode, sums_text)
    if not ok or type(t) ~= "table" then fail("checkpoint: %s/checksums.json is corrupt", path) end
    sums = t
    for name in pairs(sums) do
      if type(name) ~= "string" or not fs.exists(path .. "/" .. name) then
        fail("checkpoint: %s/%s is missing (incomplete checkpoint?)", path, tostring(name))
      end
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
