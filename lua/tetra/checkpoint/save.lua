-- tetra.checkpoint.save: a save in three parts, so that the middle one can run on a
-- background thread (checkpoint.async, tetra.checkpoint.async):
--   plan         at the step boundary, on every rank (collective: ZeRO-1 moments are put
--                together): the temporary directory and the list of files this rank
--                writes, { name =, tensors = { {NAME, tensor} }, meta = } or
--                { name =, bytes = string }, `summed` when checksums.json lists it
--   write_files  writes them (each fsynced) and returns their checksums (CRC-32C; a
--                safetensors file's per block as well, dir.save_summed): here, or in
--                tetra.checkpoint's writer thread (engine/io/ckpt_writer.c) from host copies
--   finish       on every rank once every rank wrote (collective): sums_NNNNN.json, then
--                rank 0 merges the index and the checksums, renames the directory and
--                moves `latest`
local ffi = require("ffi")
local C = require("tetra.ffi").C
local fs = require("tetra.util.fs")
local json = require("tetra.util.json")
local fail = require("tetra.util.errors").raise
local folder = require("tetra.checkpoint.dir")
local rng = require("tetra.checkpoint.rng")
local shards = require("tetra.checkpoint.shards")
local F = require("tetra.nn.functional")

local M = {}

function M.world_size(env) return env.mesh.size or 1 end

-- True when env trains some layers in FP8 (their scaling state goes in the checkpoint).
function M.fp8_layers(env)
  return env.amp and env.amp.fp8_states and next(env.amp.fp8_states) ~= nil
end

local function barrier(env)
  local w = env.mesh.world
  if w and w.size > 1 then w:barrier() end
end

-- -- Planning ----------------------------------------------------------------------------

function M.plan(env)
  local ck = env.cfg.checkpoint or {}
  local dir = ck.dir
  if not dir or dir == "" then fail("checkpoint.save: set checkpoint.dir") end
  local step, rank = env.step_count, env.rank or 0
  local name = folder.step_name(step)
  local plan = { dir = dir, name = name, tmp = dir .. "/.tmp." .. name,
                 final = dir .. "/" .. name, rank = rank, keep = ck.keep or 2,
                 split = shards.split_layout(env), files = {} }
  if rank == 0 then
    fs.mkdir_p(dir, "checkpoint.dir")
    if fs.exists(plan.tmp) then fs.remove_tree(plan.tmp, "checkpoint") end
    fs.mkdir_p(plan.tmp, "checkpoint.dir")
  end
  barrier(env)

  local opt, files = env.optimizer, plan.files
  local optim_meta = { step_count = tostring(opt.step_count),
                       kind = opt.m and "adamw" or "sgd" }
  local slices = shards.local_slices(env)   -- collective under ZeRO-1
  if plan.split then shards.shard_files(env, slices, rank, optim_meta, files) end
  local data_step
  if env.data.state then
    local st_, c = env.data:state(), env.mesh.coords or {}
    if (c.tp or 0) == 0 and (c.cp or 0) == 0 and (c.pp or 0) == 0 then
      files[#files + 1] = { name = string.format("loader_dp_%05d.bin", c.dp or 0),
                            bytes = st_.loader, summed = true }
    end
    data_step = st_.step
  end
  if M.fp8_layers(env) then
    -- Every rank writes its layers' FP8 scaling state (ranks of a data-parallel group
    -- see different data, so their amax histories differ).
    files[#files + 1] = { name = string.format("fp8_%05d.json", rank), summed = true,
                          bytes = json.encode(env.amp:fp8_state_dict()) .. "\n" }
  end
  if rank == 0 then
    if not plan.split then
      files[#files + 1] = { name = "model.safetensors", tensors = shards.model_entries(slices),
                            summed = true }
      files[#files + 1] = { name = "optim.safetensors", tensors = shards.optim_entries(slices),
                            meta = optim_meta, summed = true }
    end
    local scaler = env.amp and env.amp.scaler
    files[#files + 1] = { name = "state.json", summed = true, bytes = json.encode({
      format = 1, step = step, tokens_seen = env.tokens_seen,
      rng = rng.state_text(), world_size = M.world_size(env),
      zero_sharded = shards.zero_sharded(env), optimizer = optim_meta.kind,
      optimizer_step = opt.step_count, sharded_params = plan.split or nil,
      scaler = scaler and scaler:state_dict() or nil,
      data = data_step and { step = data_step } or nil,
      guard = env.guard and env.guard:state() or nil,
      config = env.cfg,
    }) .. "\n" }
  end
  return plan
end

-- -- Writing -----------------------------------------------------------------------------

function M.write_files(plan)
  local crcs = {}
  for i, f in ipairs(plan.files) do
    local path = plan.tmp .. "/" .. f.name
    if f.tensors then
      crcs[i] = folder.save_summed(path, f.tensors, f.meta)
      for _, kt in ipairs(f.tensors) do   -- host copies of this save's own (ZeRO): written
        if kt[3] then F.free(kt[2]) end
      end
      f.tensors = nil
    else
      fs.write_file(path, f.bytes, "checkpoint")
      crcs[i] = folder.crc_of_string(f.bytes)
    end
  end
  return crcs
end

-- A save that could not write its files (a full disk, a quota, an I/O error): this
-- rank's part of the temporary directory goes (rank 0 owns the directory and removes it
-- whole), and the run stops with one line. `latest` still names the checkpoint before.
function M.abandon(plan, err)
  local msg = tostring(type(err) == "table" and err.message or err):gsub("^[^:]*%.lua:%d+: ", "")
  msg = msg:gsub("^checkpoint: ", "")
  pcall(function()
    if plan.rank == 0 then
      if fs.exists(plan.tmp) then fs.remove_tree(plan.tmp, "checkpoint") end
    else
      for _, f in ipairs(plan.files) do
        for _, path in ipairs({ plan.tmp .. "/" .. f.name, plan.tmp .. "/" .. f.name .. ".tmp" }) do
          os.remove(path)
        end
      end
    end
  end)
  local latest = fs.read_file(plan.dir .. "/latest")
  fail("checkpoint: step %d was not saved: %s (its partial files were removed; %s)",
       tonumber(plan.name:match("%d+")), msg,
       latest and ("the last checkpoint is still " .. plan.dir .. "/" .. latest:gsub("%s+$", ""))
              or "there is no earlier checkpoint")
end

-- The writer thread's calls (engine/io/ckpt_writer.c) report through tt_last_error.
function M.check_io(rc)
  if rc ~= 0 then fail("checkpoint: %s", ffi.string(C.tt_last_error())) end
end

local writer_box = ffi.new("tt_ckpt_writer *[1]")
function M.new_writer()
  M.check_io(C.tt_ckpt_writer_new(writer_box))
  return ffi.gc(writer_box[0], C.tt_ckpt_writer_free)
end

-- Waits for writer w's thread and frees it; returns the checksums.json entry of each of
-- the first n queued operations (those that wrote a file): its CRC-32C (8 hex digits),
-- or for a safetensors file its block sums (tetra.checkpoint.dir's block_entry).
local block_box, sums_box = ffi.new("uint64_t[1]"), ffi.new("const uint32_t *[1]")
function M.end_writer(w, n)
  local rc = C.tt_ckpt_writer_wait(w)
  local msg = rc ~= 0 and ffi.string(C.tt_last_error())
  local crcs = {}
  for i = 1, msg and 0 or (n or 0) do
    local crc = bit.tohex(tonumber(C.tt_ckpt_writer_crc(w, i - 1)), 8)
    local blocks = tonumber(C.tt_ckpt_writer_blocks(w, i - 1, block_box, sums_box))
    crcs[i] = blocks >= 0 and folder.block_entry(crc, block_box[0], sums_box[0], blocks) or crc
  end
  C.tt_ckpt_writer_free(ffi.gc(w, nil))
  if msg then fail("checkpoint: %s", msg) end
  return crcs
end

-- -- Publishing --------------------------------------------------------------------------

-- Rank 0, once every rank wrote: the text of checksums.json, merged from the
-- sums_NNNNN.json parts in tmp (which it removes) and `extra` ({ FILE = crc }).
local function merge_sums(tmp, extra)
  local sums = {}
  for _, e in ipairs(fs.listdir(tmp) or {}) do
    if e:match("^sums_%d+%.json$") then
      for f, c in pairs(json.decode(fs.read_file(tmp .. "/" .. e))) do sums[f] = c end
      local ok, err = os.remove(tmp .. "/" .. e)
      if not ok then fail("checkpoint: cannot remove %s: %s", e, tostring(err)) end
    end
  end
  for f, c in pairs(extra) do sums[f] = c end
  return json.encode(sums) .. "\n"
end

-- Once this rank's files are written (crcs: their checksums.json entries in plan order),
-- on every rank:
-- its checksums go to sums_NNNNN.json (a part rank 0 merges and removes: not fsynced,
-- checksums.json is), then, once every rank got there, rank 0 returns a writer queued
-- with the publishing: index.json and checksums.json written and fsynced, the directory
-- fsynced and renamed to step_NNNNNN, `latest` replaced (a temporary file renamed),
-- each rename made durable by an fsync of checkpoint.dir. Other ranks return nil.
function M.publishing(env, plan, crcs)
  local sums, any = {}, false
  for i, f in ipairs(plan.files) do
    if f.summed then sums[f.name], any = crcs[i], true end
  end
  if any then
    local path = plan.tmp .. string.format("/sums_%05d.json", plan.rank)
    local f, err = io.open(path, "wb")
    if not f then fail("checkpoint: cannot write %s: %s", path, tostring(err)) end
    f:write(json.encode(sums), "\n")
    f:close()
  end
  barrier(env)   -- every rank's files are on disk
  if plan.rank ~= 0 then return nil end
  local tmp, final, dir = plan.tmp, plan.final, plan.dir
  local w = M.new_writer()
  local extra = {}
  if plan.split then
    local index = shards.merge_index(tmp)
    extra["index.json"] = folder.crc_of_string(index)
    M.check_io(C.tt_ckpt_writer_add_bytes(w, tmp .. "/index.json", index, #index))
  end
  local text = merge_sums(tmp, extra)
  M.check_io(C.tt_ckpt_writer_add_bytes(w, tmp .. "/checksums.json", text, #text))
  M.check_io(C.tt_ckpt_writer_add_fsync(w, tmp))
  if fs.exists(final) then fs.remove_tree(final, "checkpoint") end
  M.check_io(C.tt_ckpt_writer_add_rename(w, tmp, final))
  M.check_io(C.tt_ckpt_writer_add_fsync(w, dir))
  local latest = plan.name .. "\n"
  M.check_io(C.tt_ckpt_writer_add_bytes(w, dir .. "/latest.tmp", latest, #latest))
  M.check_io(C.tt_ckpt_writer_add_rename(w, dir .. "/latest.tmp", dir .. "/latest"))
  M.check_io(C.tt_ckpt_writer_add_fsync(w, dir))
  return w
end

-- Publishes the plan's files, written (crcs: their CRC-32C), on this thread; rank 0 then
-- prunes the old checkpoints. Returns the checkpoint's path.
function M.finish(env, plan, crcs)
  local w = M.publishing(env, plan, crcs)
  if w then
    M.check_io(C.tt_ckpt_writer_start(w))
    M.end_writer(w)
    folder.prune(plan.dir, plan.keep, plan.name)
  end
  barrier(env)
  return plan.final
end

return M
