-- tetra.checkpoint.async: saves written by a background thread while training goes on
-- (checkpoint.async). At most one save is in flight, env.ckpt_inflight: { plan =,
-- writer =, phase = "write" (every rank's thread writes its files) or "publish" (rank 0's
-- thread renames and moves `latest`; the other ranks are done with it) }.
local ffi = require("ffi")
local C = require("tetra.ffi").C
local T = require("tetra.tensor")
local F = require("tetra.nn.functional")
local folder = require("tetra.checkpoint.dir")
local save = require("tetra.checkpoint.save")
local shards = require("tetra.checkpoint.shards")

local M = {}

-- Queues on writer the safetensors file f (see tetra.checkpoint.save's plan) at path, from
-- host copies of its tensors taken now (appended to copies, for the caller to free once
-- the writer holds its own references).
local function queue_safetensors(writer, path, f, copies)
  local n = #f.tensors
  local names = ffi.new("const char *[?]", math.max(n, 1))
  local ts = ffi.new("tt_tensor *[?]", math.max(n, 1))
  for i, kt in ipairs(f.tensors) do
    -- A copy the next steps cannot change, in host memory (kt[3]: t is one already).
    local t = kt[2]
    local host = kt[3] and t or shards.host_copy(t)
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
  save.check_io(C.tt_ckpt_writer_add_safetensors(writer, path, names, ts, n, mk, mv, nm))
end

-- Starts writing checkpoint.dir/step_NNNNNN for env's current step (collective) and
-- returns; the files are host copies of the state taken now, written by a background
-- thread while training goes on. One save still in flight is completed first. M.poll at
-- each later step boundary publishes it once every rank's thread has finished; M.drain
-- waits for it.
function M.save(env)
  M.drain(env)
  local writer = save.new_writer()
  local copies = {}
  -- ZeRO-3: the plan's parameters are host copies already, taken unit by unit.
  local plan = save.plan(env)
  T.no_grad(function()
    for _, f in ipairs(plan.files) do
      local path = plan.tmp .. "/" .. f.name
      if f.tensors then
        queue_safetensors(writer, path, f, copies)
        f.tensors = nil   -- the plan outlives the step: it must not keep the state alive
      else
        save.check_io(C.tt_ckpt_writer_add_bytes(writer, path, f.bytes, #f.bytes))
      end
    end
  end)
  for _, t in ipairs(copies) do F.free(t) end   -- the writer holds its own references
  C.tt_ckpt_writer_set_delay_ms(writer, (env.cfg.checkpoint or {}).async_delay_ms or 0)
  save.check_io(C.tt_ckpt_writer_start(writer))
  env.ckpt_inflight = { plan = plan, writer = writer, phase = "write" }
end

-- Every rank's files are written: the publishing starts (collective; rank 0's thread).
local function start_publishing(env)
  local fl = env.ckpt_inflight
  local ok, crcs = pcall(save.end_writer, fl.writer, #fl.plan.files)
  if not ok then
    env.ckpt_inflight = nil
    save.abandon(fl.plan, crcs)
  end
  local w = save.publishing(env, fl.plan, crcs)
  if not w then
    env.ckpt_inflight = nil
    return
  end
  save.check_io(C.tt_ckpt_writer_start(w))
  fl.writer, fl.phase = w, "publish"
end

-- Rank 0's publishing is done: old checkpoints go.
local function end_publishing(env)
  local fl = env.ckpt_inflight
  env.ckpt_inflight = nil
  save.end_writer(fl.writer)
  folder.prune(fl.plan.dir, fl.plan.keep, fl.plan.name)
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
    done_flag = done_flag or T.from_table({ 0 })
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

return M
