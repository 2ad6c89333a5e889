-- tetra.train.graph: work captured once and replayed (train.cuda_graphs).
--
--   local g = graph.new(device)        -- a CUDA device (or graph.new(C.TT_CPU, { check = true }))
--   g:capture(function() ... end)      -- records the work; nothing runs yet on CUDA
--   g:replay()                         -- runs it (call once after capture for the first run)
--   g:close()
--
-- On CUDA, capture() records the kernels the function launches on the current stream (a
-- stream of its own: the legacy default stream cannot be captured) into a CUDA graph, its
-- memory from a private allocator pool (tt_alloc_pool_*): every block the captured kernels
-- touch stays reserved for the graph, also once the tensors that held them are freed, so
-- a replay writes nothing another tensor owns. Whatever the function reads from outside
-- the pool (parameters, optimizer state, the step's stats, a static input tensor) must
-- stay where it is while the graph lives; values that change between replays must be
-- written into such memory before each replay. A host wait inside the function (a read
-- of a device value) makes the capture fail with the engine's message.
--
-- The check mode (CPU, for tests: no GPU needed) stands in for it: capture() runs the
-- function once in the pool (that run is the first replay: the next replay() returns at
-- once), and each later replay() runs it again there, failing when the function reads a
-- device value (F.item, an optimizer's read_stats) or the pool must grow (a replay may
-- only reuse the capture's memory). Host work inside the function runs once on CUDA, at
-- the capture: the methods named in opts.host_once ({ object, "method" } pairs: version
-- counters moved, marks set) do nothing in its later replays, as they would on CUDA.
-- What it cannot see: other host values the function bakes into kernel arguments or
-- branches on, since it runs the function again instead of replaying launches.
local ffi = require("ffi")
local C = require("tetra.ffi").C
local tffi = require("tetra.ffi")

local graph = {}

local Graph = {}
Graph.__index = Graph

-- Released by close(), or when the graph is collected without one (the blocks its tensors
-- still hold return to the cache when they are freed).
local function new_pool(device)
  local box = ffi.new("tt_alloc_pool *[1]")
  tffi.check(C.tt_alloc_pool_new(device, box), 3)
  return ffi.gc(box[0], C.tt_alloc_pool_release)
end

-- device: the engine device id. opts.check: the CPU check mode (any device); opts.readers:
-- optimizers whose read_stats the check mode refuses during a run; opts.host_once: the
-- check mode's host work that a replay does not repeat (above).
function graph.new(device, opts)
  opts = opts or {}
  local self = setmetatable({ device = device, check = opts.check or false,
                              readers = opts.readers or {}, host_once = opts.host_once or {},
                              pool = new_pool(device), replays = 0,
                              stats = ffi.new("tt_alloc_pool_stats") }, Graph)
  if not self.check then
    tffi.cdef_header("tetra_cuda.h")
    if device == C.TT_CPU then
      error("tetra.train.graph: CUDA graphs need a CUDA device (graph.new(dev, { check = true }) " ..
            "runs the CPU check)", 2)
    end
  end
  return self
end

-- Runs fn with this thread's allocations on the device coming from the pool.
local function in_pool(self, fn)
  tffi.check(C.tt_alloc_pool_use(self.device, self.pool), 3)
  local ok, err = pcall(fn)
  C.tt_alloc_pool_use(self.device, nil)
  if not ok then error(err, 0) end
end

-- The check mode's guards: reads of device values fail while fn runs (F.item, and the
-- read_stats of the optimizers given to graph.new).
local function without_reads(self, fn)
  local F = require("tetra.nn.functional")
  local item = F.item
  local function refuse(what)
    return function()
      error("tetra.train.graph: " .. what .. " inside a captured step reads a device value; on " ..
            "CUDA that wait makes the capture fail", 2)
    end
  end
  F.item = refuse("F.item")
  local own = {}   -- what the instances held themselves (nil: the class's method)
  for i, opt in ipairs(self.readers) do
    own[i] = rawget(opt, "read_stats")
    opt.read_stats = refuse("read_stats")
  end
  local ok, err = pcall(fn)
  F.item = item
  for i, opt in ipairs(self.readers) do opt.read_stats = own[i] end
  if not ok then error(err, 0) end
end

function Graph:pool_stats()
  tffi.check(C.tt_alloc_pool_stats_get(self.pool, self.stats), 2)
  return { reserved_bytes = tonumber(self.stats.reserved_bytes),
           taken_bytes = tonumber(self.stats.taken_bytes), grown = tonumber(self.stats.grown) }
end

function Graph:capture(fn)
  if self.captured then error("tetra.train.graph: already captured", 2) end
  if self.check then
    in_pool(self, function() without_reads(self, fn) end)
    self.fn, self.ran = fn, true
  else
    -- Everything queued so far finished: the cached blocks the capture takes need no
    -- ordering against another stream (the legacy default stream may not be touched
    -- while a stream of ours is captured).
    tffi.check(C.tt_cuda_synchronize(), 2)
    C.tt_alloc_mark_idle(self.device)
    in_pool(self, function()
      tffi.check(C.tt_cuda_graph_begin(), 2)
      local ok, err = pcall(fn)
      local box = ffi.new("tt_cuda_graph *[1]")
      local rc = C.tt_cuda_graph_end(box)   -- ends the capture in any case
      if not ok then error(err, 0) end
      tffi.check(rc, 2)
      self.exec = ffi.gc(box[0], C.tt_cuda_graph_destroy)
    end)
  end
  self.captured = true
  self.grown = self:pool_stats().grown
end

function Graph:replay()
  if not self.captured then error("tetra.train.graph: replay before capture", 2) end
  self.replays = self.replays + 1
  if not self.check then
    tffi.check(C.tt_cuda_graph_replay(self.exec), 2)
    return
  end
  if self.ran then   -- the capture's run was this replay
    self.ran = false
    return
  end
  local own = {}   -- (as in without_reads: what the instances held themselves)
  for i, m in ipairs(self.host_once) do
    own[i] = rawget(m[1], m[2])
    m[1][m[2]] = function() end
  end
  local ok, err = pcall(in_pool, self, function() without_reads(self, self.fn) end)
  for i, m in ipairs(self.host_once) do m[1][m[2]] = own[i] end
  if not ok then error(err, 0) end
  local grown = self:pool_stats().grown
  if grown ~= self.grown then
    error(string.format("tetra.train.graph: a replay took %d new blocks beyond the capture's " ..
                        "memory (a CUDA graph replays its capture's addresses only)",
                        grown - self.grown), 2)
  end
end

-- Destroys the graph; the pool's blocks return to the device's cache once the tensors
-- still holding some are freed.
function Graph:close()
  if self.exec then
    C.tt_cuda_graph_destroy(ffi.gc(self.exec, nil))
    self.exec = nil
  end
  if self.pool ~= nil then
    C.tt_alloc_pool_release(ffi.gc(self.pool, nil))
    self.pool = nil
  end
  self.fn = nil
end

return graph
