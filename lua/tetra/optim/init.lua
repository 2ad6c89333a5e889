-- tetra.optim: AdamW and SGD over fused C steps, gradient clipping, learning-rate schedules.
--
--   local opt = optim.AdamW(model:named_parameters(), { lr = 3e-4, weight_decay = 0.1 })
--   local norm = opt:clip_grad_norm(1.0)
--   opt:step(schedule(step))
--   opt:zero_grad()
--
-- Weight decay applies to parameters with two or more dims (matrices, embeddings) and not
-- to norm scales or biases, as in GPT-2 / nanoGPT / Llama training code.
-- The state is public: opt.params, opt.names, opt.m, opt.v, opt.step_count (checkpoints
-- and ZeRO-1 sharding read and replace it).
--
-- AdamW steps each group of parameters with one multi-tensor call (tt_adamw_multi) on CPU
-- and CUDA alike, and keeps the step's scalars in a stats tensor on the parameters' device
-- (tt_step_stats_new): clip_grad_norm computes the norm and the clip coefficient there,
-- the update reads the coefficient (and found_inf) from there, so on CUDA nothing waits
-- for the device between backward and the update; read_stats() is the one read.
--   opt:clip_grad_norm_async(1.0)   -- device only
--   opt:step(lr)                    -- skipped on the device if the norm was not finite
--   local s = opt:read_stats()      -- { grad_norm =, found_inf =, loss = } (one wait)
-- opt:set_bf16_copies(list) gives the update a bf16 tensor per parameter (or nil) that
-- receives the updated weight rounded to bf16.
local ffi = require("ffi")
local C = require("tetra.ffi").cdef_header("tetra_amp.h").C

local optim = {}

local function check(status)
  if status ~= 0 then error(ffi.string(C.tt_last_error()), 3) end
end

-- Accepts an array of tensors or of { name, tensor } pairs (Module:named_parameters()).
local function normalise(params)
  local names, tensors = {}, {}
  for i, p in ipairs(params) do
    if type(p) == "table" then
      names[i], tensors[i] = p[1], p[2]
    else
      names[i], tensors[i] = "param" .. (i - 1), p
    end
  end
  return names, tensors
end

local function carray(list)
  local arr = ffi.new("tt_tensor*[?]", math.max(#list, 1))
  for i, t in ipairs(list) do arr[i - 1] = t end
  return arr
end

local pout = require("tetra.tensor").pout
local T_key = require("tetra.tensor").key
local take = require("tetra.tensor").take

-- f32 zeros shaped like t on t's device: the optimizer state lives beside its parameter.
-- (Also used by ZeRO-1 for the moments of its parameter shards.) Lazy (tetra.h): the
-- memory is taken at first use, so the whole-parameter moments that ZeRO replaces by its
-- shards' are never allocated (8 bytes a parameter on every rank).
local function zeros_like(t)
  return take(C.tt_tensor_lazy_zeros(t._shape, t._ndim, t._device, pout), 3)
end
optim.state_like = zeros_like

-- The parameters as a C array, with their Lua references kept alive by the optimizer.
local function base(params)
  local names, tensors = normalise(params)
  return { names = names, params = tensors, c_params = carray(tensors), n = #tensors,
           step_count = 0 }
end

-- SGD's clipping: the norm on the host, the grads scaled in place.
local function clip_grad_norm(self, max_norm)
  local norm = ffi.new("double[1]")
  if max_norm and max_norm > 0 then
    check(C.tt_clip_grad_norm(self.c_params, self.n, max_norm, norm))
  else
    check(C.tt_grad_norm(self.c_params, self.n, norm))
  end
  return norm[0]
end

local function zero_grad(self)
  for _, p in ipairs(self.params) do C.tt_zero_grad(p) end
end

-- -- AdamW -----------------------------------------------------------------------------

local AdamW = {}
AdamW.__index = AdamW
AdamW.zero_grad = zero_grad

-- cfg: lr (1e-3), beta1 (0.9), beta2 (0.95), eps (1e-8), weight_decay (0.1).
function optim.AdamW(params, cfg)
  cfg = cfg or {}
  local self = setmetatable(base(params), AdamW)
  self.lr = cfg.lr or 1e-3
  self.beta1, self.beta2 = cfg.beta1 or 0.9, cfg.beta2 or 0.95
  self.eps = cfg.eps or 1e-8
  self.weight_decay = cfg.weight_decay or 0.1
  self.m, self.v = {}, {}
  for i, p in ipairs(self.params) do
    self.m[i], self.v[i] = zeros_like(p), zeros_like(p)
  end
  self:_build_groups()
  return self
end

-- Splits the parameters into a decayed (2-D and up) and an undecayed group of C arrays.
-- Call again after replacing params/m/v (ZeRO-1 keeps only its shards, shaped (1, k) for
-- matrices so that they stay in the decayed group).
function AdamW:_build_groups()
  local groups = { { wd = self.weight_decay, p = {}, m = {}, v = {}, b = {}, any_b = false },
                   { wd = 0.0, p = {}, m = {}, v = {}, b = {}, any_b = false } }
  local bf16 = self.bf16 or {}
  for i, p in ipairs(self.params) do
    local g = p._ndim >= 2 and groups[1] or groups[2]
    local k = #g.p + 1
    g.p[k], g.m[k], g.v[k], g.b[k] = p, self.m[i], self.v[i], bf16[i]
    g.any_b = g.any_b or bf16[i] ~= nil
  end
  self.groups = {}
  for _, g in ipairs(groups) do
    if #g.p > 0 then
      local c_b = nil
      if g.any_b then   -- a C array with NULL where a parameter has no copy
        c_b = ffi.new("tt_tensor*[?]", #g.p)
        for k = 1, #g.p do c_b[k - 1] = g.b[k] end
      end
      self.groups[#self.groups + 1] = { n = #g.p, wd = g.wd, c_p = carray(g.p),
        c_m = carray(g.m), c_v = carray(g.v), c_bf16 = c_b, keep = g }
    end
  end
  self.c_params, self.n = carray(self.params), #self.params
  self._cfg = ffi.new("tt_adamw_config")
end

-- The stats tensor, made at the first call.
function AdamW:stats_tensor()
  if not self._stats then
    local p = self.params[1]
    self._stats = take(C.tt_step_stats_new(p and p._device or C.TT_CPU, pout), 2)
    self._fresh_stats = true
  end
  return self._stats
end

-- The stats tensor of this step, reset on its first use in the step (the next update
-- ends the step).
function AdamW:stats()
  self:stats_tensor()
  if self._fresh_stats then
    self._fresh_stats = false
  elseif not self._pending then
    check(C.tt_step_stats_reset(self._stats))
  end
  self._pending = true
  return self._stats
end

local stats_box = ffi.new("float[?]", C.TT_STEP_STATS_N)

-- The norm of the gradients of `list` (default: every parameter) and the clip
-- coefficient min(1, max_norm / (norm + 1e-6)) that the next update applies, on the
-- device. opts (for a model split over ranks): group, a tetra.dist group whose (hi, lo)
-- sums of squares are all-gathered and added (every rank of it must call this);
-- replicas, how many times each gradient is counted in that sum (1).
function AdamW:clip_grad_norm_async(max_norm, list, opts)
  local stats = self:stats()
  local arr, n = self.c_params, self.n
  if list then arr, n = carray(list), #list end
  check(C.tt_grad_sumsq(arr, n, stats))
  local gathered = nil
  local group = opts and opts.group
  if group and group.size > 1 then
    local part = take(C.tt_narrow(stats, 0, C.TT_STAT_SUMSQ_HI, 2, pout), 2)
    gathered = group:all_gather(part, 0)
    part:free()
  end
  check(C.tt_clip_finish(stats, gathered, opts and opts.replicas or 1, max_norm or 0))
  if gathered then gathered:free() end
end

-- The step's scalars, read from the device (the one wait for it): grad_norm, grad_scale
-- (the clip coefficient the update applies), found_inf
-- (the update was or will be skipped: a gradient, the norm or the loss was not finite, or
-- the loss a spike), spike (the loss was above the limit tt_step_stats_set_loss_limit
-- set), loss.
-- A failed device-side input check (CUDA deferred checks) raises its message here.
function AdamW:read_stats()
  check(C.tt_step_stats_read(self._stats or self:stats(), stats_box))
  self.last_stats = { grad_norm = stats_box[C.TT_STAT_GRAD_NORM],
                      grad_scale = stats_box[C.TT_STAT_GRAD_SCALE],
                      found_inf = stats_box[C.TT_STAT_FOUND_INF] ~= 0,
                      spike = stats_box[C.TT_STAT_SPIKE] ~= 0,
                      loss = stats_box[C.TT_STAT_LOSS] }
  return self.last_stats
end

-- fp16: divides the grads of params by the loss scale (inv_scale = 1 / scale, or nil:
-- the stats' TT_STAT_INV_SCALE, read on the device) in place and leaves found_inf in the
-- stats, agreed (max) over `group` on the device.
function AdamW:unscale_into_stats(params, inv_scale, group)
  local stats = self:stats()
  if inv_scale then
    check(C.tt_grads_unscale_to_stats(carray(params), #params, inv_scale, stats))
  else
    check(C.tt_grads_unscale_by_stats(carray(params), #params, stats))
  end
  if group and group.size > 1 then
    local flag = take(C.tt_narrow(stats, 0, C.TT_STAT_FOUND_INF, 1, pout), 2)
    group:all_reduce(flag, "max")
    flag:free()
  end
end

-- Ends this step's use of the stats without an update (a skipped step): the next use
-- starts from clean stats.
function AdamW:end_step()
  self._pending = false
end

-- clip_grad_norm_async, then the norm read back (one wait on CUDA). Returns the norm.
function AdamW:clip_grad_norm(max_norm, list, opts)
  self:clip_grad_norm_async(max_norm, list, opts)
  return self:read_stats().grad_norm
end

-- bf16 copies of the updated weights: list[i] a bf16 tensor of params[i]'s numel, or nil.
function AdamW:set_bf16_copies(list)
  self.bf16 = list
  self:_build_groups()
end

-- Counts the next update and writes its learning rate (default: the constructor's) and
-- bias corrections into the stats, where the update reads them (a device write, no
-- wait). step() does it itself unless self.external_update is set: then the caller does,
-- before the update is launched or a captured one replayed (tetra.train's CUDA graphs).
function AdamW:set_update(lr)
  self.step_count = self.step_count + 1
  self._lr = lr or self.lr
  check(C.tt_step_stats_set_update(self:stats_tensor(), self._lr, self.beta1, self.beta2,
                                   self.step_count))
end

-- tetra.nn.functional, loaded at first use (it loads this module's users).
local F_ = nil
local function F() F_ = F_ or require("tetra.nn.functional"); return F_ end

-- Optimizer offload (parallel.offload_optimizer): the moments move to host memory and
-- every update runs on the CPU's AdamW kernel: each parameter and its gradient are
-- copied to host buffers (kept from step to step), updated there with a host copy of the
-- step's stats (learning rate, bias corrections, clip coefficient, found_inf), and the
-- parameter copied back, its bf16 copy (tetra.optim.amp) refreshed from it. The device
-- keeps the parameters and gradients only: the moments' two parameter-sized f32 tensors
-- are gone from it. On the CPU the same copies, kernel and stats run host to host, so the
-- run is bit for bit the one without offload (tests/lua/offload_spec.lua); on CUDA the
-- update is the CPU kernel's, the parameters' and gradients' host buffers page-locked
-- (host_f32; the moments are not: no async copy moves them). Call after
-- ZeRO's attach_optimizer (the moments of this rank's shards move). Returns self.
function AdamW:offload_state()
  if self.offloaded then return self end
  for i, p in ipairs(self.params) do
    local m, v = self.m[i], self.v[i]
    -- (pageable: only the CPU kernel reads them, and only synchronous copies move them, at
    -- checkpoints; page-locked memory is scarce, and 8 bytes an element of it for the
    -- moments alone would take an 8B model's host memory whole)
    self.m[i], self.v[i] = self:host_f32(p, false), self:host_f32(p, false)
    check(C.tt_copy_(self.m[i], m))
    check(C.tt_copy_(self.v[i], v))
    F().free(m); F().free(v)
  end
  self.offloaded = true
  self._host = {}   -- parameter index -> { p = host copy, g = host gradient }
  -- Made now, not at the first update: a lack of page-locked memory stops the set-up, not
  -- step 1 halfway, and the allocations (each stops other streams' work while it runs,
  -- CUDA's "implicit synchronization") stay out of the steps.
  for i = 1, #self.params do self:_host_of(i) end
  self:_build_groups()
  return self
end

-- An uninitialised host f32 tensor shaped like p, for the offloaded update. When p is on
-- a GPU it is page-locked (cudaHostAlloc, through tt_cuda_host_alloc): the copies between
-- it and the device then run straight at the link's rate, where pageable memory is
-- staged through the driver's own pinned buffer, a second copy on the host. The blocks
-- live as long as the optimizer (self._pinned holds them; each frees itself when
-- collected); the tensors wrap them without owning them (tt_tensor_from_buffer).
-- pinned == false: pageable in any case (memory no async copy touches).
function AdamW:host_f32(p, pinned)
  if p._device == C.TT_CPU or pinned == false then
    return take(C.tt_tensor_empty(p._shape, p._ndim, C.TT_F32, C.TT_CPU, pout), 3)
  end
  local tffi = require("tetra.ffi")
  tffi.cdef_header("tetra_cuda.h")
  local box = ffi.new("void *[1]")
  check(C.tt_cuda_host_alloc(p:numel() * 4, box))
  self._pinned = self._pinned or {}
  self._pinned[#self._pinned + 1] = ffi.gc(box[0], C.tt_cuda_host_free)
  return take(C.tt_tensor_from_buffer(box[0], p._shape, p._ndim, C.TT_F32, pout), 3)
end

-- The f32 master weights on the host as well (train.setup: offload under bf16 / fp16,
-- ZeRO stage 0, 1 or 2): `weights` are the parameters that only the GEMMs read, through
-- their bf16 / fp16 copies (tetra.optim.amp). Through forward and backward each keeps
-- just that copy on the device: release_masters (before the forward) gives its f32
-- memory back, after bringing the host master up to date when something else wrote the
-- weight since the last step (a checkpoint load, a roll-back, the REPL); the offloaded
-- update then needs no download of it, writes the host master and uploads it into memory
-- taken again; settle_masters (after the update, skipped or not) restores any still
-- released and records the versions. Between steps every weight is whole on the device,
-- so checkpoints, evaluation, export and the REPL read it as ever. dtype: C.TT_BF16 or
-- C.TT_F16.
-- Stage 0: each weight is an optimizer parameter of its own, its host master whole.
-- ZeRO-1 and 2 (zero): the optimizer's parameters are this rank's shards, views into
-- the weights; zero.whole_of[j] is the weight that parameter j is a piece of, and
-- zero.gather() the reducer's all-gather of every shard into the weights (collective).
-- The host keeps this rank's share of a master only; a weight of which the rank owns no
-- share has none here. After the update, masters_home takes every released weight's
-- memory again and puts its share there (the gather fills the rest); a step without an
-- update gathers them in settle_masters.
-- ZeRO-3 (zero.away): the optimizer's parameters are views into the reducer's buffers of
-- this rank's shares, and their host copies are the masters: release_masters downloads
-- the shares something else wrote since the update, then zero.away() gives the buffers'
-- device memory back (the blocks' gathers send compute-dtype copies meanwhile, and the
-- units outside the blocks stay gathered); the update (_step_offloaded) takes it again
-- (zero.home()) and uploads every updated share, with no download; settle_masters and
-- whole_masters upload them where no update did (a skipped or failed step, a checkpoint,
-- an evaluation). Nothing collective: the shares are this rank's own. `weights` is
-- unused there (every share goes).
-- Returns how many weights (ZeRO-3: shares) qualified.
function AdamW:masters_on_host(weights, dtype, zero)
  assert(self.offloaded, "masters_on_host: call offload_state first")
  if zero and zero.away then
    self._shares = { away = zero.away, home = zero.home, bytes = zero.bytes, out = false,
                     versions = {} }
    self._master_dtype = dtype
    return #self.params
  end
  local index = {}
  if zero then
    for j, w in pairs(zero.whole_of) do index[T_key(w)] = j end
  else
    for i, p in ipairs(self.params) do index[T_key(p)] = i end
  end
  self._masters, self._master_of, self._master_dtype = {}, {}, dtype
  self._gather_masters = zero and zero.gather or nil
  for _, w in ipairs(weights) do
    local i = index[T_key(w)]
    if i or zero then   -- under ZeRO a weight may have no share on this rank
      local st = { w = w, i = i, released = false, version = nil }
      self._masters[#self._masters + 1] = st
      if i then self._master_of[i] = st end
    end
  end
  return #self._masters
end

-- Bytes of f32 master weights kept in host memory (0 without masters_on_host): this
-- rank's shares under ZeRO.
function AdamW:host_master_bytes()
  local b = 0
  if self._shares then
    for _, p in ipairs(self.params) do b = b + p:numel() * 4 end
    return b
  end
  for i in pairs(self._master_of or {}) do b = b + self.params[i]:numel() * 4 end
  return b
end

-- Bytes of f32 weights off the device through forward and backward (the whole weights,
-- also under ZeRO-1 and 2; under ZeRO-3 the shares' buffers less the compute-dtype copies
-- kept for the gathers).
function AdamW:released_master_bytes()
  local b = 0
  if self._shares then
    local away, kept = self._shares.bytes()
    return away - kept
  end
  for _, st in ipairs(self._masters or {}) do b = b + st.w:numel() * 4 end
  return b
end

local lowp_box = ffi.new("tt_tensor*[1]")

-- Parameter index -> true for the weights of an overlapped update not landed yet.
local function landing(self)
  local set = {}
  for _, t in ipairs(self._inflight and self._inflight.order or {}) do
    if not t.landed then set[t.i] = true end
  end
  return set
end

-- The host buffers of optimizer parameter i (made at first use).
function AdamW:_host_of(i)
  local h = self._host[i]
  if not h then
    local p = self.params[i]
    h = { p = self:host_f32(p), g = self:host_f32(p) }
    self._host[i] = h
  end
  return h
end

-- ZeRO-3: the versions of the shares as the host masters hold them.
function AdamW:_shares_seen()
  local versions = self._shares.versions
  for i, p in ipairs(self.params) do versions[i] = C.tt_tensor_version(p) end
end

-- ZeRO-3: the shares back on the device from their host masters (after a step that made
-- no update, or one that failed; before a checkpoint or an evaluation). No-op when home.
function AdamW:_shares_home()
  local sh = self._shares
  if not sh.out then return end
  sh.home()
  for i, p in ipairs(self.params) do check(C.tt_copy_(p, self._host[i].p)) end
  sh.out = false
  self:_shares_seen()
end

function AdamW:release_masters()
  local sh = self._shares
  if sh then
    if sh.out then self:_shares_home() end   -- a failed update left them so
    for i, p in ipairs(self.params) do
      if sh.versions[i] ~= C.tt_tensor_version(p) then
        check(C.tt_copy_(self:_host_of(i).p, p))
      end
    end
    sh.away()
    sh.out = true
    return
  end
  if not self._masters then return end
  if self._pieces then self:whole_masters() end   -- a failed step left them so
  local later = landing(self)   -- released as they land (AdamW:arrive)
  for _, st in ipairs(self._masters) do
    local w, i = st.w, st.i
    if i and later[i] then goto continue end
    -- A weight whose copy does not exist yet (the first step makes each where the GEMMs
    -- want it: grouped weights share one buffer) keeps its master for this step.
    if not st.released and w._lowp ~= nil and w._lowp._dtype == self._master_dtype then
      if i and st.version ~= C.tt_tensor_version(w) then
        check(C.tt_copy_(self:_host_of(i).p, self.params[i]))
      end
      -- the copy the GEMMs will read, cast in place now if the weight changed since
      check(C.tt_lowp_weight(w, self._master_dtype, lowp_box))
      C.tt_tensor_release(lowp_box[0])
      check(C.tt_lowp_weight_release_master(w))
      st.released = true
      if self._gather_masters then st.pieces, self._pieces = true, true end
    end
    ::continue::
  end
end

-- The host weight h.p queued for upload into p (f32, contiguous, on a GPU) on the
-- current stream, the next kernels after it.
local function upload_async(p, h)
  check(C.tt_cuda_copy_to_device_async(C.tt_tensor_data(p), p._device,
                                       C.tt_tensor_data(h.p), p:numel() * 4))
  C.tt_tensor_bump_version(p)   -- (a write the engine did not see, as tt_copy_ counts one)
end

-- The master's memory taken again and the host master copied into it (the update's
-- upload, or settle_masters for a step that made none). p: the optimizer's parameter
-- (under ZeRO a share of the weight, whose storage it is).
local function restore_master(p, h, async)
  check(C.tt_lowp_weight_restore_master(p))
  if async then
    upload_async(p, h)
  else
    check(C.tt_copy_(p, h.p))
  end
end

-- ZeRO: every weight still released (no share of it on this rank, or a step without an
-- update) given its memory again, with this rank's share from the host master; the
-- reducer's gather then fills the rest. No-op otherwise.
function AdamW:masters_home()
  if not self._gather_masters then return end
  for _, st in ipairs(self._masters) do
    if st.released then
      if st.i then
        restore_master(self.params[st.i], self._host[st.i], false)
      else
        check(C.tt_lowp_weight_restore_master(st.w))
      end
      st.released = false
    end
  end
end

-- ZeRO: every weight whole on the device again from the shares, if a step released any
-- (or always: the update's gather, DDP:optimizer_step). Collective: every rank of the
-- reducer's group calls it at the same point.
function AdamW:whole_masters(always)
  if self._shares then return self:_shares_home() end
  if not (self._gather_masters and (always or self._pieces)) then return end
  self:masters_home()
  self._gather_masters()
  self._pieces = nil
  for _, st in ipairs(self._masters) do
    st.pieces, st.version = nil, C.tt_tensor_version(st.w)
  end
end

-- failed: the step raised an error. Under ZeRO its ranks may then be anywhere, so nothing
-- collective runs: weights in pieces (released, or taken back and not gathered yet) get
-- their memory back holding this rank's share and NaN elsewhere, and stay marked
-- (self._pieces) until whole_masters gathers them, before anything reads them again (the
-- next step, a checkpoint, an evaluation).
function AdamW:settle_masters(failed)
  if self._shares then return self:_shares_home() end   -- ZeRO-3: nothing collective
  if not self._masters then return end
  local later = landing(self)   -- an overlapped update's weights land in the next forward
  if self._gather_masters then
    if not failed then return self:whole_masters() end
    if not self._pieces then return end
    for _, st in ipairs(self._masters) do
      if st.pieces then
        check(C.tt_lowp_weight_restore_master(st.w))
        check(C.tt_fill_(st.w, 0 / 0))
        if st.i then check(C.tt_copy_(self.params[st.i], self._host[st.i].p)) end
        st.released = false
      end
    end
    return
  end
  for _, st in ipairs(self._masters) do
    local w, i = st.w, st.i
    if not later[i] then
      if st.released then   -- no update wrote it (a skipped step): the copy is current
        restore_master(w, self._host[i], false)
        check(C.tt_lowp_weight_mark_fresh(w))
        st.released = false
      end
      st.version = C.tt_tensor_version(w)
    end
  end
end

-- The offloaded update overlapped with the next step's forward (train.setup, where the
-- optimizer updates whole weights): block_of maps a parameter's key to its block's
-- number in forward order (1, 2, ...; absent: outside the blocks, wanted first). The
-- caller calls arrive(j) before block j's forward (arrive(0) before the step's), and
-- finish_update before anything else that reads or writes the weights.
function AdamW:overlap_with(block_of)
  assert(self.offloaded, "overlap_with: call offload_state first")
  self._overlap, self._block_of = true, block_of
end

-- The offloaded update: each parameter with a gradient, in group order, one CPU call
-- each (the elementwise update of its group's call). On a GPU, a parameter and its
-- gradient that are contiguous f32 tensors go down and come back by asynchronous copies
-- on the current stream between page-locked buffers (tt_cuda_copy_to_host_async,
-- tt_cuda_copy_to_device_async): every download is queued first, each with an event
-- after it, then the host waits only for the parameter it updates next, so the link
-- brings the next ones while the CPU computes, and each updated parameter goes back up
-- while the CPU moves on; the next step's kernels follow the uploads in stream order. The
-- buffers are safe to reuse: the next step's download into them is queued after this
-- step's upload from them. Anything else (the CPU, a strided shard) copies synchronously.
-- The values are the same either way.
local one = { p = ffi.new("tt_tensor*[1]"), m = ffi.new("tt_tensor*[1]"),
              v = ffi.new("tt_tensor*[1]"), b = ffi.new("tt_tensor*[1]") }
local ev_box   -- a tt_cuda_event *[1], once tetra_cuda.h is declared (host_f32 on a GPU)

local function async_ok(p, grad)
  return p._device ~= C.TT_CPU and p._dtype == C.TT_F32 and grad._dtype == C.TT_F32
     and p:is_contiguous() and grad:is_contiguous()
end

-- The updated host weight back on the device: uploaded (into memory taken again for a
-- released master), its bf16 copy refreshed from it. `away`: a master that goes on
-- through forward and backward without its f32 memory (the overlapped update's arrival
-- in the next step's forward): its copy made current and the master released again.
function AdamW:_land(t, away)
  local p, h, k, g = t.p, t.h, t.k, t.g
  if t.master then
    restore_master(p, h, t.async)
    t.master.released = false
  elseif t.async then
    upload_async(p, h)
  else
    check(C.tt_copy_(p, h.p))   -- synchronous: the CPU, a strided shard
  end
  local b = g.keep.b[k]
  if b then
    local flat, bflat = F().view(p, { p:numel() }), F().view(b, { b:numel() })
    check(C.tt_copy_(bflat, flat))
    F().free(flat); F().free(bflat)
  end
  local st = self._master_of and self._master_of[t.i]
  if away and st and p._lowp ~= nil and p._lowp._dtype == self._master_dtype then
    if b then check(C.tt_lowp_weight_mark_fresh(p)) end
    check(C.tt_lowp_weight(p, self._master_dtype, lowp_box))
    C.tt_tensor_release(lowp_box[0])
    check(C.tt_lowp_weight_release_master(p))
    st.released = true
    st.version = C.tt_tensor_version(p)
  end
end

function AdamW:_step_offloaded(cfg, stats)
  self:_drain()
  if not self._host_stats then
    self._host_stats = take(C.tt_step_stats_new(C.TT_CPU, pout), 2)
  end
  check(C.tt_copy_(self._host_stats, stats))
  local index = {}
  for i, p in ipairs(self.params) do index[p] = i end
  -- ZeRO-3 with the shares away: their memory taken again; the host masters are current
  -- (no download), and the update uploads each (the rest below, then sh.out is false).
  local sh = self._shares
  local shares_out = sh and sh.out
  if shares_out then sh.home() end
  local todo = {}
  for _, g in ipairs(self.groups) do
    for k = 1, g.n do
      local p = g.keep.p[k]
      local grad = p.grad
      if grad then
        local i = index[p]
        local h = self:_host_of(i)
        local st = self._master_of and self._master_of[i]
        todo[#todo + 1] = { g = g, k = k, p = p, grad = grad, h = h, i = i,
                            async = async_ok(p, grad),
                            master = st and st.released and st or shares_out and {} or nil }
      end
    end
  end
  for _, t in ipairs(todo) do   -- every download queued before the first update
    if t.async then
      local h, dev = t.h, t.p._device
      if not h.ev then
        ev_box = ev_box or ffi.new("tt_cuda_event *[1]")
        check(C.tt_cuda_event_create(0, ev_box))
        h.ev = ffi.gc(ev_box[0], C.tt_cuda_event_destroy)
      end
      local bytes = t.p:numel() * 4
      if not t.master then   -- a released master's host copy is current already
        check(C.tt_cuda_copy_to_host_async(C.tt_tensor_data(h.p), C.tt_tensor_data(t.p), dev,
                                           bytes))
      end
      check(C.tt_cuda_copy_to_host_async(C.tt_tensor_data(h.g), C.tt_tensor_data(t.grad),
                                         dev, bytes))
      check(C.tt_cuda_event_record(h.ev, C.tt_cuda_get_stream()))
    end
  end
  local function on_host(t)   -- t's parameter and gradient in its host buffers
    if t.async then
      check(C.tt_cuda_event_synchronize(t.h.ev))
    else
      if not t.master then check(C.tt_copy_(t.h.p, t.p)) end
      check(C.tt_copy_(t.h.g, t.grad))
    end
    t.h.p.grad = t.h.g
  end
  if self._overlap then return self:_start_overlapped(cfg, todo, on_host) end
  for _, t in ipairs(todo) do
    local g, k, h = t.g, t.k, t.h
    cfg.weight_decay = g.wd
    on_host(t)
    one.p[0], one.m[0], one.v[0] = h.p, g.keep.m[k], g.keep.v[k]
    check(C.tt_adamw_multi(one.p, one.m, one.v, nil, 1, cfg, self.step_count,
                           self._host_stats))
    self:_land(t)
    F().free(t.grad)
  end
  if sh then
    if shares_out then   -- a share without a gradient: its master as it was
      local updated = {}
      for _, t in ipairs(todo) do updated[t.i] = true end
      for i, p in ipairs(self.params) do
        if not updated[i] then check(C.tt_copy_(p, self:_host_of(i).p)) end
      end
      sh.out = false
    end
    self:_shares_seen()
  end
end

-- The update overlapped with the next step's forward (offload_overlap): every gradient
-- on the host first (one wait), then the host updates on a thread of their own
-- (tt_adamw_jobs), in the order the forward wants the weights: those outside the blocks
-- (needed from the start), then block by block. Each lands when the forward reaches it
-- (arrive), at the latest before the next update or whatever else reads the weights
-- (finish_update).
function AdamW:_start_overlapped(cfg, todo, on_host)
  for _, t in ipairs(todo) do
    on_host(t)
    F().free(t.grad)
    t.grad = nil
  end
  local block_of = self._block_of
  local order = {}
  for _, t in ipairs(todo) do
    t.block = block_of[T_key(t.p)] or 0
    order[#order + 1] = t
  end
  table.sort(order, function(a, b)   -- stable by position among equal blocks
    if a.block ~= b.block then return a.block < b.block end
    return a.i < b.i
  end)
  local n = #order
  if n == 0 then return end
  local ps, ms, vs = ffi.new("tt_tensor*[?]", n), ffi.new("tt_tensor*[?]", n),
                     ffi.new("tt_tensor*[?]", n)
  local cfgs = ffi.new("tt_adamw_config[?]", n)
  for j, t in ipairs(order) do
    ps[j - 1], ms[j - 1], vs[j - 1] = t.h.p, t.g.keep.m[t.k], t.g.keep.v[t.k]
    cfgs[j - 1] = cfg
    cfgs[j - 1].weight_decay = t.g.wd
    t.job = j - 1
  end
  local box = ffi.new("tt_adamw_jobs*[1]")
  check(C.tt_adamw_jobs_start(ps, ms, vs, cfgs, n, self.step_count, self._host_stats, box))
  local jobs = ffi.gc(box[0], C.tt_adamw_jobs_finish)   -- joined if the optimizer goes
  local by_block = {}
  for _, t in ipairs(order) do
    by_block[t.block] = by_block[t.block] or {}
    table.insert(by_block[t.block], t)
  end
  self._inflight = { jobs = jobs, order = order, by_block = by_block }
end

-- The weights of block j (0: those outside the blocks) landed on the device, waiting
-- for their host updates where needed; from the next step's forward, the masters kept
-- away again (see masters_on_host).
function AdamW:arrive(j)
  local f = self._inflight
  if not f or not f.by_block[j] then return end
  for _, t in ipairs(f.by_block[j]) do
    if not t.landed then
      check(C.tt_adamw_jobs_wait(f.jobs, t.job))
      self:_land(t, true)
      t.landed = true
    end
  end
end

-- The rest of an overlapped update landed (each weight whole on the device, as the
-- synchronous update leaves it), the thread joined. Masters landed away stay away: the
-- next update (which calls this first) finds their host copy current.
function AdamW:_drain()
  local f = self._inflight
  if not f then return end
  self._inflight = nil
  local ok, err = true, nil
  for _, t in ipairs(f.order) do
    if ok and not t.landed then
      ok, err = pcall(function()
        check(C.tt_adamw_jobs_wait(f.jobs, t.job))
        self:_land(t)
        t.landed = true
      end)
    end
  end
  local rc = C.tt_adamw_jobs_finish(ffi.gc(f.jobs, nil))
  if not ok then error(err, 0) end
  check(rc)
end

-- Every weight landed and whole on the device, no master kept away: anything but the
-- next step's forward calls this first (tetra.train.step at a step's end unless the
-- loop says the next step follows, tetra.train.loop before a roll-back).
-- failed: after a step's error (see settle_masters).
function AdamW:finish_update(failed)
  self:_drain()
  self:settle_masters(failed)   -- nothing is landing now: every master made whole
end

-- Whether an overlapped update is still landing.
function AdamW:update_in_flight() return self._inflight ~= nil end
-- One update with learning rate lr (default: the constructor's; ignored with
-- external_update, see set_update). Uses this step's clip coefficient and found_inf when
-- clip_grad_norm (or an unscale into the stats) ran.
function AdamW:step(lr)
  if not self.external_update then self:set_update(lr) end
  local cfg = self._cfg
  cfg.lr = self._lr
  cfg.beta1, cfg.beta2, cfg.eps = self.beta1, self.beta2, self.eps
  cfg.lr_from_stats = 1
  local stats = self:stats()
  if self.offloaded then
    self:_step_offloaded(cfg, stats)
  else
    for _, g in ipairs(self.groups) do
      cfg.weight_decay = g.wd
      check(C.tt_adamw_multi(g.c_p, g.c_m, g.c_v, g.c_bf16, g.n, cfg, self.step_count, stats))
    end
  end
  self:end_step()
end

-- The last update was skipped on the device (found_inf, known from read_stats after it
-- was launched): its step no longer counts, so the next one's bias correction is right.
function AdamW:uncount_step()
  self.step_count = self.step_count - 1
end

-- -- SGD -------------------------------------------------------------------------------

local SGD = {}
SGD.__index = SGD
SGD.clip_grad_norm = clip_grad_norm
SGD.zero_grad = zero_grad

-- cfg: lr (1e-2), momentum (0), weight_decay (0, applied to every parameter).
function optim.SGD(params, cfg)
  cfg = cfg or {}
  local self = setmetatable(base(params), SGD)
  self.lr = cfg.lr or 1e-2
  self.momentum = cfg.momentum or 0.0
  self.weight_decay = cfg.weight_decay or 0.0
  self.buffers = {}
  for i, p in ipairs(self.params) do self.buffers[i] = zeros_like(p) end
  self.c_buffers = carray(self.buffers)
  return self
end

function SGD:step(lr)
  self.step_count = self.step_count + 1
  check(C.tt_sgd_step(self.c_params, self.c_buffers, self.n, lr or self.lr, self.momentum,
                      self.weight_decay))
end

-- -- Schedules -------------------------------------------------------------------------

-- Returns lr(step) for 1-based optimizer steps. cfg: lr, warmup_steps (0), steps (total),
-- min_lr (0), schedule ("cosine", "linear", "constant" or "wsd"), and for wsd
-- decay_steps and decay_shape ("linear", "cosine" or "sqrt"; default linear).
--   warmup:   lr * step / warmup_steps for step <= warmup_steps, then with progress p
--             going 0 -> 1 from the end of warmup to `steps`:
--   cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2
--   linear:   lr + (min_lr - lr) * p
--   constant: lr
--   wsd:      (warmup-stable-decay) lr until steps - decay_steps, then decay_shape from
--             lr to min_lr with p going 0 -> 1 over the last decay_steps steps (1 / n at
--             the first of them, 1 at the last); sqrt is min_lr + (lr - min_lr) *
--             (1 - sqrt(p)). The stable part does not depend on `steps`, so a checkpoint
--             taken there resumes into a longer run.
-- The shapes of a decay from lr to min_lr as p goes 0 -> 1 (wsd's decay_shape), and the
-- schedules after the warmup (wsd aside).
local shapes = {
  cosine = function(lr, min_lr, p) return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p)) end,
  linear = function(lr, min_lr, p) return lr + (min_lr - lr) * p end,
  sqrt = function(lr, min_lr, p) return min_lr + (lr - min_lr) * (1.0 - math.sqrt(p)) end,
}
local decays = { cosine = shapes.cosine, linear = shapes.linear,
                 constant = function(lr) return lr end }

local function wsd(lr, min_lr, warmup, total, cfg)
  local n, shape = cfg.decay_steps, shapes[cfg.decay_shape or "linear"]
  if type(n) ~= "number" or n < 1 or n % 1 ~= 0 then
    error("optim.schedule: wsd needs decay_steps, a whole number >= 1, got " .. tostring(n), 3)
  end
  if not shape then
    error("optim.schedule: unknown decay_shape '" .. tostring(cfg.decay_shape) ..
          "' (expected linear, cosine or sqrt)", 3)
  end
  if not total then error("optim.schedule: wsd needs steps (the run's total)", 3) end
  local start = total - n
  return function(step)
    if warmup > 0 and step <= warmup then return lr * step / warmup end
    if step <= start then return lr end
    return shape(lr, min_lr, math.min(1.0, (step - start) / n))
  end
end

function optim.schedule(cfg)
  local lr, warmup = cfg.lr, cfg.warmup_steps or 0
  local min_lr, total = cfg.min_lr or 0.0, cfg.steps
  if cfg.schedule == "wsd" then return wsd(lr, min_lr, warmup, total, cfg) end
  local decay = decays[cfg.schedule or "cosine"]
  if not decay then
    error("optim.schedule: unknown schedule '" .. tostring(cfg.schedule) ..
          "' (expected cosine, linear, constant or wsd)", 2)
  end
  return function(step)
    if warmup > 0 and step <= warmup then return lr * step / warmup end
    if not total or total <= warmup then return lr end
    return decay(lr, min_lr, math.min(1.0, (step - warmup) / (total - warmup)))
  end
end

return optim
