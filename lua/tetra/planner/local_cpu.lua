-- tetra.planner.local_cpu: the rates of the machine `tetra plan --cluster cpu` runs on,
-- measured here rather than taken from the preset (which describes another machine), and
-- cached per machine.
--
--   local rates = local_cpu.rates()          -- cached, or measured now (about 10 s)
--   local rates = local_cpu.rates({ fresh = true })   -- measured again
--
-- What is measured, one rank per core as the cpu cluster runs:
--   peak_flops   the engine's own f32 GEMM (tt_linear, this binary's BLAS) on one thread,
--                1024 x 1024 x 1024, best of 5
--   mem_bw       one thread's copy of a 128 MiB tensor (bytes read and written), best of 5
--   links        an all-reduce between 2 ranks under mpirun (tools/bench/plan_comm.lua):
--                latency from the smallest, bandwidth from the two largest, as
--                tools/bench/plan.sh calibrates; the preset's when mpirun fails (said so)
--   devices_per_node  the cores online
-- The cache is one file, ${TETRA_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/tetra}/cpu-rates.lua,
-- keyed by the CPU model, the core count, the BLAS core and this tetra's version: any
-- change measures again. The sustained fraction stays the preset's (1.0: these are the
-- kernels' own rates); `tetra sweep --calibrate` fits it from a run.
local ffi = require("ffi")
local C = require("tetra.ffi").C
local fs = require("tetra.util.fs")

pcall(ffi.cdef, [[
const char *openblas_get_corename(void);
long sysconf(int name);
]])
pcall(ffi.cdef, [[int tt_plan_getpid(void) __asm__("getpid");]])

local M = {}

-- The CPU's model name, its online cores, the BLAS core: the cache's key.
function M.machine()
  local info = fs.read_file("/proc/cpuinfo") or ""
  local model = info:match("model name%s*:%s*([^\n]+)") or "unknown CPU"
  local cores = tonumber(C.sysconf(84)) or 1   -- _SC_NPROCESSORS_ONLN
  local ok, core = pcall(function() return ffi.string(C.openblas_get_corename()) end)
  return { model = model, cores = math.max(1, cores), blas = ok and core or "unknown",
           version = require("tetra").version or "?" }
end

local function key_of(m)
  return table.concat({ m.model, m.cores, m.blas, m.version }, " | ")
end

function M.cache_path()
  local dir = os.getenv("TETRA_CACHE_DIR")
  if not dir or dir == "" then
    local base = os.getenv("XDG_CACHE_HOME")
    if not base or base == "" then base = (os.getenv("HOME") or "/tmp") .. "/.cache" end
    dir = base .. "/tetra"
  end
  return dir .. "/cpu-rates.lua", dir
end

local function now() return require("tetra.obs.metrics").now() end

-- Best seconds of `reps` runs of fn.
local function best(reps, fn)
  local b = math.huge
  for _ = 1, reps do
    local t0 = now()
    fn()
    b = math.min(b, now() - t0)
  end
  return b
end

local function measure_compute()
  local T = require("tetra.tensor")
  local F = require("tetra.nn.functional")
  local threads = C.tt_get_num_threads()
  C.tt_set_num_threads(1)
  local n = 1024
  local a, b = T.randn({ n, n }), T.randn({ n, n })
  F.free(F.linear(a, b))   -- warm-up (a @ b^T)
  local t_mm = best(5, function() F.free(F.linear(a, b)) end)
  F.free(a); F.free(b)
  local big = 32 * 1024 * 1024   -- floats: 128 MiB
  local src, dst = F.zeros({ big }), F.zeros({ big })
  dst:copy_(src)
  local t_cp = best(5, function() dst:copy_(src) end)
  F.free(src); F.free(dst)
  C.tt_set_num_threads(threads)
  return 2 * n * n * n / t_mm, 2 * 4 * big / t_cp
end

-- The all-reduce points of plan_comm.lua under mpirun: latency_s, bandwidth (B/s), or
-- nil and why.
local function measure_links()
  local exe = fs.self_exe()
  local root = require("tetra.host").root
  local script = root .. "/tools/bench/plan_comm.lua"
  if not exe then return nil, "cannot find this tetra (/proc/self/exe)" end
  if not io.open(script, "r") then return nil, "no " .. script end
  local cmd = ("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 " ..
               "timeout 120 mpirun --oversubscribe --bind-to none -np 2 %s run %s 2>&1")
              :format(fs.shell_quote(exe), fs.shell_quote(script))
  local p = io.popen(cmd)
  if not p then return nil, "cannot start mpirun" end
  local b, t, last = {}, {}, ""
  for line in p:lines() do
    local bytes, secs = line:match("^allreduce (%d+) (%S+)")
    if bytes then b[#b + 1], t[#t + 1] = tonumber(bytes), tonumber(secs) end
    if line:match("%S") then last = line end
  end
  p:close()
  local n = #b
  if n < 2 or t[n] <= t[1] then return nil, "mpirun gave no all-reduce times (" .. last .. ")" end
  -- The slope between the smallest and the largest (4 KB, 16 MB): between the two largest
  -- a loaded machine can give a negative one.
  return t[1] / 2, (b[n] - b[1]) / (t[n] - t[1])
end

local function write_cache(path, dir, key, r)
  os.execute("mkdir -p " .. fs.shell_quote(dir))
  -- Written under a name of this process's own (its host's too: a home may be shared),
  -- then renamed over the cache: two plans measuring at once on one home each replace
  -- the whole file, never half of it.
  local host = (fs.read_file("/proc/sys/kernel/hostname") or ""):gsub("[^%w.-]", "")
  local tmp = ("%s.%s.%d.tmp"):format(path, host, C.tt_plan_getpid())
  -- (The text first: nothing is opened until it is whole.)
  local text = "-- tetra plan --cluster cpu: this machine's measured rates (delete to measure again)\n" ..
    ("return { key = %q, peak_flops = %.17g, mem_bw = %.17g, devices_per_node = %d,\n")
      :format(key, r.peak_flops, r.mem_bw, r.devices_per_node) ..
    ("  latency_s = %s, link_bw = %s, links_note = %q, measured = %q }\n"):format(
      r.latency_s and ("%.17g"):format(r.latency_s) or "nil",
      r.link_bw and ("%.17g"):format(r.link_bw) or "nil", r.links_note or "", r.measured)
  local f = io.open(tmp, "w")
  if not f then return end
  f:write(text)
  f:close()
  if not os.rename(tmp, path) then os.remove(tmp) end
end

-- This machine's rates: { peak_flops, mem_bw, devices_per_node, latency_s, link_bw (nil
-- when the links could not be measured: links_note says why), measured (a date), cached
-- (true when read from the cache), model, blas }. opts.fresh: measure even when cached;
-- opts.say(text): progress lines while measuring.
function M.rates(opts)
  opts = opts or {}
  local m = M.machine()
  local key = key_of(m)
  local path, dir = M.cache_path()
  if not opts.fresh then
    local chunk = loadfile(path)
    local ok, r = pcall(chunk or error)
    if ok and type(r) == "table" and r.key == key and r.peak_flops and r.mem_bw then
      r.cached, r.model, r.blas, r.path = true, m.model, m.blas, path
      return r
    end
  end
  if opts.say then opts.say("measuring this machine's rates for the cpu cluster (about 10 s; cached in " .. path .. ")") end
  local flops, bw = measure_compute()
  -- (latency and bandwidth, or nil and why)
  local lat, link = measure_links()
  local why
  if not lat then link, why = nil, link end
  local r = { peak_flops = flops, mem_bw = bw, devices_per_node = m.cores,
              latency_s = lat, link_bw = link, links_note = why,
              measured = os.date("!%Y-%m-%d %H:%M UTC") }
  write_cache(path, dir, key, r)
  r.cached, r.model, r.blas, r.path = false, m.model, m.blas, path
  return r
end

-- The cpu cluster's fields from rates r (for tetra.planner.cluster's `over`), and one line
-- that says where they come from.
function M.over(r)
  local over = { peak_flops = r.peak_flops, mem_bw = r.mem_bw,
                 devices_per_node = r.devices_per_node,
                 name = ("this machine: %s, %d cores, one rank per core (BLAS core %s)")
                        :format(r.model, r.devices_per_node, r.blas) }
  if r.link_bw then
    over.latency_s, over.intra_bw, over.inter_bw = r.latency_s, r.link_bw, r.link_bw
  end
  local line = ("cpu rates measured here %s%s: GEMM %.1f GFLOP/s a core, copy %.1f GB/s, %s")
    :format(r.measured, r.cached and (" (cached: " .. r.path .. ")") or "",
            r.peak_flops / 1e9, r.mem_bw / 1e9,
            r.link_bw and ("all-reduce %.0f us + %.2f GB/s"):format(r.latency_s * 1e6, r.link_bw / 1e9)
            or ("the preset's links (" .. tostring(r.links_note) .. ")"))
  return over, line
end

return M
