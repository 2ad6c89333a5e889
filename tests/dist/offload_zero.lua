-- A recipe for offload_zero.sh: the tiny Llama (or, with train.inject_step set, the fp16
-- overflow of fp16_overflow.lua) for train.steps steps, every rank printing each step's
-- loss and gradient norm (exactly, %a), its allocator step peak, and the master-weight
-- bytes the records carry:
--   offload_zero rank R step N loss L grad_norm G peak P host_masters H released_masters D
--     weights W
-- (W: this rank's parameters' bytes in f32, whole even where ZeRO-3 shards them).
-- With the environment's OFFLOAD_ZERO_FAIL=N,M, steps N and M fail on every rank after
-- their gradients are complete (before the update), once each, and the run goes on: after
-- N an evaluation first ("offload_zero rank R step N failed eval E"), after M straight
-- to the next step ("... step M failed"); each failed step runs again.
-- With OFFLOAD_ZERO_PROBE set, see probe below.
-- With OFFLOAD_ZERO_RELOAD=N,M (and checkpoint.dir set), a checkpoint is saved after step
-- N and loaded back into the running job after step M ("... step M reloaded"), as the
-- loss guard's roll-back does: steps N+1 to M run again.
local tetra = require("tetra")
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")

-- fp16_overflow.lua's defaults: a copy of the tiny Llama's with its overflow's keys,
-- here in fp32 and injecting nothing unless told.
local defaults = dofile(here .. "/fp16_overflow.lua").defaults
defaults.train.precision, defaults.train.inject_step = tiny.defaults.train.precision, 0

local recipe = { name = "offload_zero", defaults = defaults }

function recipe.run(cfg)
  local t = cfg.train
  local fail_at = {}   -- step -> true while it is still to fail
  local evaluate_after = nil
  for n in (os.getenv("OFFLOAD_ZERO_FAIL") or ""):gmatch("%d+") do
    fail_at[tonumber(n)] = true
    evaluate_after = evaluate_after or tonumber(n)
  end
  local data = tetra.train.data_source(cfg)
  tetra.manual_seed(t.seed)
  local model = tiny.Model(cfg.model)
  local env = tetra.train.setup(cfg, model, data, { plan = tiny.plan,
    on_grads = function(e, step)
      if step == t.inject_step and e.rank == e.mesh.size - 1 then
        local ps = e.optimizer.params   -- an overflow in this rank's last shard
        require("tetra.ffi").C.tt_tensor_set(ps[#ps]._grad, 0, 1 / 0)
      end
      if fail_at[step] then
        fail_at[step] = nil   -- once: the step that failed runs again next
        error("offload_zero: failing step " .. step)
      end
    end })
  local function say(fmt, ...)
    io.stdout:write(string.format("offload_zero rank %d " .. fmt .. "\n", env.rank, ...))
    io.stdout:flush()
  end
  -- OFFLOAD_ZERO_PROBE (ZeRO-3): after step 1, the masters sent away as before a forward
  -- and the first block's unit gathered in f32, as a checkpoint would: with the shares on
  -- the host that must be refused with a message ("... probe refused: MESSAGE"), not read
  -- freed memory; without offload it is gathered ("... probe gathered") and released.
  -- Then the masters come home and the run goes on.
  local function probe(say)
    local C, ffi = require("tetra.ffi").C, require("ffi")
    local opt, r = env.optimizer, env.ddp._reducer
    if opt.release_masters then opt:release_masters() end
    if C.tt_dist_reducer_unit_gather_whole(r, 1) == 0 then
      assert(C.tt_dist_reducer_unit_release(r, 1) == 0)
      say("probe gathered")
    else
      say("probe refused: %s", ffi.string(C.tt_last_error()))
    end
    if opt.whole_masters then opt:whole_masters() end
  end
  local weight_bytes = 0   -- this rank's parameters in f32 (whole, also under ZeRO-3)
  for _, e in ipairs(env.par:placements()) do weight_bytes = weight_bytes + 4 * e.tensor:numel() end
  local save_at, load_at = (os.getenv("OFFLOAD_ZERO_RELOAD") or ""):match("(%d+),(%d+)")
  save_at, load_at = tonumber(save_at), tonumber(load_at)
  local checkpoint = require("tetra.checkpoint")
  local saved
  while env.step_count < t.steps do
    local ok, r = pcall(env.step)
    if ok and r.step == 1 and os.getenv("OFFLOAD_ZERO_PROBE") then probe(say) end
    if ok and r.step == save_at then saved = checkpoint.save(env) end
    if ok and r.step == load_at and saved then
      checkpoint.load(env, saved)
      saved = nil
      say("step %d reloaded", r.step)
    end
    if ok then
      say("step %d loss %a grad_norm %a peak %d host_masters %d released_masters %d " ..
          "weights %d", r.step, r.loss, r.grad_norm, r.step_peak_bytes,
          r.host_master_bytes or 0, r.released_master_bytes or 0, weight_bytes)
    elseif tostring(r):find("failing step", 1, true) then
      local n = env.step_count + 1
      if n == evaluate_after then say("step %d failed eval %a", n, env.evaluate(2))
      else say("step %d failed", n) end
    else
      error(r, 0)
    end
  end
  return 0
end

return recipe
