-- A recipe for memory.sh: the tiny Llama set up in the layout --set gives; every rank
-- prints what it holds ("memory rank R tp T pp P params N grads N optimizer N", bytes)
-- after one step, and before it the allocator's peak through the set-up ("setup rank R
-- peak N"; with model.init_from a checkpoint, "init rank R copied C summed S", the bytes
-- of it read). With checkpoint.dir set it then saves a checkpoint and prints how far
-- the allocator's peak rose above what the rank held before and the bytes of the host
-- copies it kept to write, the all-gathers of ZeRO-3 units it ran and the bytes of its
-- files it read back to sum them ("save rank R peak N kept K gathers G summed S"), loads
-- it back ("load rank R peak
-- N copied B summed S of T": of the T bytes of the checkpoint's safetensors files, those it
-- copied out and those it read to check their checksums).
-- MEMORY_RECIPE=gpt2: recipes/gpt2.lua's model instead of the tiny Llama. Every rank also
-- prints its first step's loss ("loss rank R L").
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/" .. (os.getenv("MEMORY_RECIPE") or "tiny") .. ".lua")

local recipe = { name = "memory", defaults = tiny.defaults }

function recipe.run(cfg)
  local env = tiny.setup(cfg)
  -- The allocator's peak from the start to the end of the set-up (the model built, its
  -- parameters drawn, sliced and sharded): on the CPU every tensor goes through it.
  local C0 = require("tetra.ffi").C
  local st0 = require("ffi").new("tt_alloc_stats")
  C0.tt_alloc_stats_get(C0.TT_CPU, st0)
  io.stdout:write(string.format("setup rank %d peak %d\n", env.rank, tonumber(st0.peak_bytes)))
  if env.init_read_bytes then   -- model.init_from a checkpoint: what this rank read of it
    io.stdout:write(string.format("init rank %d copied %d summed %d\n", env.rank,
                                  env.init_read_bytes.copied, env.init_read_bytes.summed))
  end
  local r = env.step()
  io.stdout:write(string.format("loss rank %d %.9g\n", env.rank, r.loss))
  local c = env.mesh.coords
  io.stdout:write(string.format("memory rank %d tp %d pp %d params %d grads %d optimizer %d\n",
                                env.rank, c.tp, c.pp, r.param_bytes, r.grad_bytes,
                                r.optimizer_bytes))
  if cfg.checkpoint.dir and cfg.checkpoint.dir ~= "" then
    local C = require("tetra.ffi").C
    local st = require("ffi").new("tt_alloc_stats")
    C.tt_alloc_stats_get(C.TT_CPU, st)
    local before = tonumber(st.live_bytes)
    C.tt_alloc_reset_peak(C.TT_CPU)
    local ckpt = require("tetra.checkpoint")
    local gathers, bytes = env.ddp:unit_gathers(), require("ffi").new("uint64_t[2]")
    C.tt_io_bytes(bytes, bytes + 1)
    local summed = tonumber(bytes[1])
    local path = ckpt.save(env)
    gathers = env.ddp:unit_gathers() - gathers   -- ZeRO-3's all-gathers of units
    C.tt_io_bytes(bytes, bytes + 1)
    summed = tonumber(bytes[1]) - summed   -- file bytes read back to sum them
    C.tt_alloc_stats_get(C.TT_CPU, st)
    -- What the rank kept on the host to write (on the CPU the same allocator as the
    -- "device"): its shard file's tensors that are copies, the moments, and under ZeRO-3
    -- the parameters too (ZeRO-1 and 2 write the whole parameters themselves).
    local kept, file = 0, string.format("%s/shard_%05d.safetensors", path, env.rank)
    if require("tetra.util.fs").exists(file) then
      local f = require("tetra.io").open(file)
      for _, name in ipairs(f:names()) do
        if name:match("^[mv]%.") or cfg.parallel.zero_stage == 3 then
          local n = 4
          for _, d in ipairs(f:info(name).shape) do n = n * d end
          kept = kept + n
        end
      end
      f:close()
    end
    io.stdout:write(string.format("save rank %d peak %d kept %d gathers %d summed %d\n",
                                  env.rank, tonumber(st.peak_bytes) - before, kept, gathers,
                                  summed))
    collectgarbage()
    C.tt_alloc_stats_get(C.TT_CPU, st)
    before = tonumber(st.live_bytes)
    C.tt_alloc_reset_peak(C.TT_CPU)
    ckpt.load(env, path)
    C.tt_alloc_stats_get(C.TT_CPU, st)
    -- and the bytes of the checkpoint's safetensors files it read, of all there are
    local total = 0
    for _, e in ipairs(require("tetra.util.fs").listdir(path) or {}) do
      if e:match("%.safetensors$") then
        local f = assert(io.open(path .. "/" .. e, "rb"))
        total = total + f:seek("end")
        f:close()
      end
    end
    io.stdout:write(string.format("load rank %d peak %d copied %d summed %d of %d\n",
                                  env.rank, tonumber(st.peak_bytes) - before,
                                  env.resume_read_bytes.copied, env.resume_read_bytes.summed,
                                  total))
  end
  io.stdout:flush()
  return 0
end

return recipe
