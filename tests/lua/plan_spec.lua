-- tetra.planner: the planner's memory is the engine's (a real one-process run's allocator
-- peak, the model's parameter count), its pipeline replay is the schedules' closed form,
-- its layouts are the ones the layout rules accept, its YAML loads as the same layout, and
-- it reproduces the published Megatron-LM and torchtitan rows within 15%, and the
-- framework inputs those rows need (per-op selective recompute, eager elementwise
-- kernels) cost what their hand counts say.
local plan = require("tetra.planner")
local published = require("tetra.planner.published")
local config = require("tetra.config")

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local llama = dofile(here .. "/../../recipes/llama.lua")
local gpt2 = dofile(here .. "/../../recipes/gpt2.lua")
local qwen2 = dofile(here .. "/../../recipes/qwen2/model.lua")

local function build(recipe, sets)
  local cfg = config.build({ defaults = recipe.defaults, sets = sets or {}, world_size = false })
  cfg.model.family = cfg.model.family or recipe.name
  return cfg
end

local small = { "model.dim=128", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
                "model.ffn_hidden=256", "model.vocab_size=512", "model.seq_len=64",
                "train.batch_size=4" }

describe("plan memory", function()
  it("counts the parameters the recipes build", function()
    for _, case in ipairs({ { llama, small }, { llama, { "model.tie_embeddings=true" } },
                            { gpt2, { "model.dim=64", "model.n_layers=2", "model.n_heads=4",
                                      "model.vocab_size=300", "model.seq_len=32" } },
                            { qwen2, small } }) do
      local cfg = build(case[1], case[2])
      local model = case[1].Model(cfg.model)
      expect(plan.parameter_count(cfg.model)).to_be(model:num_params())
      -- recipes/<family>/presets.lua lists the parameters model.lua builds (in the order
      -- its forward uses them).
      local built, listed = {}, {}
      for _, np in ipairs(model:named_parameters()) do built[#built + 1] = np[1] end
      local head = require("tetra.models").of(cfg.model).head
      for _, e in ipairs(plan.parameters(cfg.model)) do   -- a tied head is listed once
        if not (cfg.model.tie_embeddings and e[1] == head) then
          listed[#listed + 1] = e[1] .. "." .. e[2]
        end
      end
      table.sort(listed); table.sort(built)
      expect(listed).to_equal(built)
    end
  end)

  it("predicts a one-process run's allocator peak", function()
    -- `tetra run` as a user runs it, with one micro-batch and with two (the peak with
    -- and without the gradients of an earlier micro-batch alive).
    local sweep = require("tetra.cli.sweep")
    for _, accum in ipairs({ 1, 2 }) do
      local sets = { unpack(small) }
      sets[#sets + 1] = "train.gradient_accumulation_steps=" .. accum
      local metrics = os.tmpname()
      local cmd = { sweep.self_exe(), "run", here .. "/../../recipes/llama.lua" }
      for _, kv in ipairs(sets) do cmd[#cmd + 1] = "--set " .. kv end
      for _, kv in ipairs({ "train.steps=3", "train.warmup_steps=1", "log.progress=false",
                            "log.metrics_file=" .. metrics }) do
        cmd[#cmd + 1] = "--set " .. kv
      end
      local ok = os.execute(table.concat(cmd, " ") .. " > /dev/null 2>&1")
      expect(ok == 0 or ok == true).to_be(true)
      local measured = sweep.summarize(metrics)
      os.remove(metrics)
      local cfg = build(llama, sets)
      local pred = plan.evaluate(cfg, plan.layout_of(cfg), plan.cluster("cpu", { devices_per_node = 1 }))
      expect(pred.mem_rank0).to_be_close(measured.peak_bytes, 0.03, 0)
    end
  end)
end)

describe("tensor-parallel slices", function()
  -- One rule (tetra.parallel.tensor.slice) says what a rank holds of a styled module's
  -- parameter: tensor.apply cuts it, the planner counts it.
  local tensor = require("tetra.parallel.tensor")
  local nn = require("tetra.nn")

  it("gives each style's dim, offset and length", function()
    expect(tensor.slice("vocab_head", "weight", { 10, 6 }, 3, 2))
      .to_equal({ dim = 0, offset = 8, length = 2 })   -- parts of ceil(10 / 3) rows
    expect(tensor.slice("column", "bias", { 9 }, 3, 1)).to_equal({ dim = 0, offset = 3, length = 3 })
    expect(tensor.slice("row", "weight", { 9, 6 }, 3, 1)).to_equal({ dim = 1, offset = 2, length = 2 })
    expect(tensor.slice("row", "bias", { 9 }, 3, 1)).to_be_nil()
    expect(tensor.slice("heads_column", "weight", { 8, 16 }, 2, 1, 4))
      .to_equal({ dim = 0, offset = 4, length = 4 })
    -- Two key/value heads over four ranks: ranks 2 and 3 both hold head 1.
    expect(tensor.slice("heads_column", "weight", { 8, 16 }, 4, 3, 4))
      .to_equal({ dim = 0, offset = 4, length = 4, copy_rank = 1 })
    expect(tensor.slice("sequence", "weight", { 16 }, 4, 3)).to_be_nil()
  end)

  it("is what tensor.apply cuts", function()
    for _, case in ipairs({ { "column", 9 }, { "row", 9 }, { "vocab_head", 10 } }) do
      local style, rows = case[1], case[2]
      for rank = 0, 2 do
        local m = nn.Linear(6, rows, { bias = true })
        local g = { size = 3, rank = rank, name = "tp" }   -- apply reads no more of the group
        tensor.apply(m, "head", style, g, { sliced = {}, groups = {} })
        for _, pname in ipairs({ "weight", "bias" }) do
          local whole = pname == "weight" and { rows, 6 } or { rows }
          local part = tensor.slice(style, pname, whole, 3, rank)
          local pl = m._placement and m._placement[pname]
          if part then
            expect({ pl.dim, pl.offset, pl.length }).to_equal({ part.dim, part.offset, part.length })
            local shape = { unpack(whole) }
            shape[part.dim + 1] = part.length
            expect(m[pname]:shape()).to_equal(shape)
          else
            expect(pl).to_be_nil()
            expect(m[pname]:shape()).to_equal(whole)
          end
        end
      end
    end
  end)
end)

describe("plan data-parallel overlap", function()
  -- Tetra's reducer shrinks its buckets toward the end of backward, so what stays in
  -- flight after it is the embedding's gradient (produced last, travelling alone), not a
  -- whole 25 MB bucket; an engine with fixed buckets (cluster.fixed_buckets) keeps that.
  it("leaves the embedding's all-reduce exposed, not a whole bucket", function()
    local sets = { "model.dim=512", "model.n_layers=8", "model.n_heads=8", "model.n_kv_heads=8",
                   "model.ffn_hidden=1536", "model.vocab_size=8192", "model.seq_len=128",
                   "train.batch_size=8", "parallel.data_parallel_size=2" }
    local cfg = build(llama, sets)
    local lay = plan.layout_of(cfg)
    local shrink = plan.evaluate(cfg, lay, plan.cluster("cpu", { devices_per_node = 2 }))
    local fixed = plan.evaluate(cfg, lay, plan.cluster("cpu", { devices_per_node = 2,
                                                              fixed_buckets = true }))
    expect(shrink.exposed_comm_s < fixed.exposed_comm_s).to_be(true)
    expect(shrink.exposed_comm_s > 0).to_be(true)
    -- The weight gradients deferred behind the embedding's (dist.defer_weight_grads, the
    -- default) hide its reduction: only the tail bucket's stays, 1/32 of the gradient.
    local plain_sets = { "dist.defer_weight_grads=false" }
    for _, kv in ipairs(sets) do plain_sets[#plain_sets + 1] = kv end
    local plain = plan.evaluate(build(llama, plain_sets), lay,
                                plan.cluster("cpu", { devices_per_node = 2 }))
    expect(plain.exposed_comm_s > 1.5 * shrink.exposed_comm_s).to_be(true)
  end)
end)

describe("plan sync wait", function()
  -- cluster.sync_wait: each blocking tensor- or context-parallel collective also waits
  -- for the last rank, that share of the computation since the one before. Data and
  -- pipeline parallelism have no such collectives in a block: unchanged.
  local function eval(sizes, wait)
    local sets = { "model.dim=256", "model.n_layers=4", "model.n_heads=8", "model.n_kv_heads=4",
                   "model.ffn_hidden=768", "model.vocab_size=4096", "model.seq_len=128",
                   "train.batch_size=8" }
    for k, v in pairs(sizes) do sets[#sets + 1] = "parallel." .. k .. "=" .. v end
    local cfg = build(llama, sets)
    return plan.evaluate(cfg, plan.layout_of(cfg),
                         plan.cluster("cpu", { devices_per_node = 2, sync_wait = wait }))
  end
  it("adds that share of the blocks' and head's work under tensor parallelism", function()
    local a, b = eval({ tensor_parallel_size = 2 }, 0), eval({ tensor_parallel_size = 2 }, 0.1)
    local added = b.exposed_comm_s - a.exposed_comm_s
    -- every block and the head sync; the embedding and the optimizer (in compute_s) do not
    expect(added > 0.08 * a.compute_s and added <= 0.1 * a.compute_s).to_be(true)
    expect(b.step_s - a.step_s).to_be_near(added, 1e-12)
  end)
  it("adds it to context parallelism's blocks, not to data or pipeline parallelism", function()
    local a, b = eval({ context_parallel_size = 2 }, 0), eval({ context_parallel_size = 2 }, 0.1)
    expect(b.exposed_comm_s - a.exposed_comm_s > 0.03 * a.compute_s).to_be(true)
    for _, sizes in ipairs({ { data_parallel_size = 2 }, { pipeline_parallel_size = 2 } }) do
      expect(eval(sizes, 0.1).step_s).to_be(eval(sizes, 0).step_s)
    end
  end)
end)

describe("plan pipeline replay", function()
  -- The engine's own schedules (tetra.parallel.pipeline.schedule) with every forward 1
  -- and every backward 2 time units: m micro-batches over S stages end after
  -- (m + S - 1) x 3 units under GPipe and 1F1B; interleaving v chunks per stage (each
  -- chunk 1/v of the work) shrinks the bubble to (S - 1) x 3 / v.
  local function run(schedule, S, m, v)
    local fwd, bwd = {}, {}
    for s = 0, S - 1 do
      fwd[s], bwd[s] = {}, {}
      for c = 0, v - 1 do fwd[s][c], bwd[s][c] = 1 / v, 2 / v end
    end
    return plan.replay({ pp = S, v = v, schedule = schedule }, m, fwd, bwd, 0)
  end

  it("has the closed-form span", function()
    for _, sched in ipairs({ "gpipe", "1f1b" }) do
      for _, sm in ipairs({ { 4, 8 }, { 2, 2 }, { 4, 1 }, { 8, 16 } }) do
        local span = run(sched, sm[1], sm[2], 1)
        expect(span).to_be_near((sm[2] + sm[1] - 1) * 3, 1e-9)
      end
    end
    local span = run("interleaved_1f1b", 4, 8, 2)
    expect(span).to_be_near(8 * 3 + 3 * 3 / 2, 1e-9)
  end)

  it("holds S - s micro-batches on stage s under 1F1B, all of them under GPipe", function()
    local _, _, held = run("1f1b", 4, 8, 1)
    local _, _, all = run("gpipe", 4, 8, 1)
    for s = 0, 3 do
      expect(held[s][0]).to_be(4 - s)
      expect(all[s][0]).to_be(8)
    end
  end)

  -- A step of a billion micro-batches (train.batch_size=1e9) is priced at once: the
  -- replay extends two steady-state replays, which the closed forms check.
  it("has the closed forms at a billion micro-batches", function()
    local m = 1e9
    for _, sched in ipairs({ "gpipe", "1f1b" }) do
      for _, S in ipairs({ 1, 4 }) do
        local span, busy, held = run(sched, S, m, 1)
        expect(math.abs(span / ((m + S - 1) * 3) - 1) < 1e-12).to_be(true)
        expect(math.abs(busy[S - 1] / (m * 3) - 1) < 1e-12).to_be(true)
        expect(held[0][0]).to_be((sched == "gpipe" and S > 1) and m or S)   -- one stage: 1F1B
      end
    end
    local span = run("interleaved_1f1b", 4, 4e8, 2)
    expect(math.abs(span / (4e8 * 3 + 3 * 3 / 2) - 1) < 1e-12).to_be(true)
  end)

  it("extends to what the whole replay gives, with uneven stages and transfers", function()
    local whole = require("tetra.planner.schedule").replay_whole
    for _, case in ipairs({ { "gpipe", 3, 1 }, { "1f1b", 4, 1 }, { "interleaved_1f1b", 2, 4 },
                            { "interleaved_1f1b", 4, 2 } }) do
      local sched, S, v = case[1], case[2], case[3]
      local fwd, bwd = {}, {}
      for s = 0, S - 1 do
        fwd[s], bwd[s] = {}, {}
        for c = 0, v - 1 do
          fwd[s][c] = 1 + 0.37 * s + 0.11 * c + (s % 3) * 0.5
          bwd[s][c] = 2 * fwd[s][c] + 0.05 * s
        end
      end
      -- hop 0.3: the steady state is reached and the spans agree to rounding; hop 5
      -- (transfers outlast the work): within a micro-batch's time, measured 5.2e-4 of it.
      for _, hop_tol in ipairs({ { 0.3, 1e-9 }, { 5, 2e-3 } }) do
        local lay, n = { pp = S, v = v, schedule = sched }, S * 1007
        local a, busy_a, held_a = plan.replay(lay, n, fwd, bwd, hop_tol[1])
        local b, busy_b, held_b = whole(lay, n, fwd, bwd, hop_tol[1])
        expect(math.abs(a / b - 1) <= hop_tol[2]).to_be(true)
        for s = 0, S - 1 do
          expect(math.abs(busy_a[s] / busy_b[s] - 1) < 1e-9).to_be(true)
          for c = 0, v - 1 do expect(held_a[s][c]).to_be(held_b[s][c]) end
        end
      end
    end
  end)
end)

describe("plan layouts", function()
  local cfg = build(llama, small)
  local cl = plan.cluster("cpu", { devices_per_node = 4 })
  it("lists only layouts the layout rules accept, best first", function()
    local rows = plan.search(cfg, cl)
    expect(#rows > 10).to_be(true)
    local rules = require("tetra.parallel.layout")
    for i, r in ipairs(rows) do
      expect(r.dp * r.tp * r.pp * r.cp).to_be(4)
      if i > 1 and rows[i - 1].fits == r.fits then
        expect(rows[i - 1].tokens_per_s >= r.tokens_per_s - 1e-9).to_be(true)
      end
    end
    for _, lay in ipairs(plan.layouts(cfg, cl)) do
      expect(#rules.problems(plan.with_layout(cfg, lay), 4)).to_be(0)
    end
  end)

  it("writes a YAML config that loads as the same layout", function()
    local r = plan.search(cfg, cl)[1]
    local path = os.tmpname() .. ".yaml"
    local f = assert(io.open(path, "w"))
    f:write(plan.yaml(cfg, r, cl))
    f:close()
    local _, loaded = config.load(path, {}, { world_size = r.world })
    os.remove(path)
    local p = loaded.parallel
    expect(p.data_parallel_size).to_be(r.dp)
    expect(p.tensor_parallel_size).to_be(r.tp)
    expect(p.pipeline_parallel_size).to_be(r.pp)
    expect(p.context_parallel_size).to_be(r.cp)
    expect(p.zero_stage).to_be(r.zero_stage)
    expect(loaded.train.gradient_accumulation_steps).to_be(r.grad_accum)
    expect(loaded.model.dim).to_be(128)
  end)

  it("weighs recompute none and full, and writes the one it picks", function()
    local seen, full = {}, nil
    for _, r in ipairs(plan.search(cfg, cl)) do
      seen[r.recompute] = true
      if r.recompute == "full" and not full then full = r end
    end
    expect(seen.none).to_be(true)
    expect(seen.full).to_be(true)
    local path = os.tmpname() .. ".yaml"
    local f = assert(io.open(path, "w"))
    f:write(plan.yaml(cfg, full, cl))
    f:close()
    local _, loaded = config.load(path, {}, { world_size = full.world })
    os.remove(path)
    expect(loaded.train.recompute).to_be("full")
    local settings = table.concat(plan.settings(full), " ")
    expect(settings:find("train.recompute=full", 1, true) ~= nil).to_be(true)
  end)

  -- The issue that brought recompute: no layout of Llama-3 70B fitted 64 H100s. The
  -- guide's kind of layout (tp 4 in a node, pp 8, dp 2) fits with it and not without.
  it("fits Llama-3 70B on 64 H100s with activation recompute, not without", function()
    local big = build(llama, { "train.model_name=llama3-70b", "train.batch_size=512" })
    local h100 = plan.cluster("h100", { nodes = 8 })
    local fits = { none = 0, selective = 0, full = 0 }
    local offloaded = { none = 0, selective = 0, full = 0 }
    for _, r in ipairs(plan.search(big, h100, { fixed = { tp = 4, pp = 8, dp = 2 },
                                                max_micro_batch = 2 })) do
      local n = r.offload and offloaded or fits
      if r.fits then n[r.recompute] = n[r.recompute] + 1 end
      -- Offloaded layouts are only listed where they fit and the same one without does
      -- not, and they hold no optimizer state on the device.
      if r.offload then
        expect(r.fits).to_be(true)
        expect(r.mem.optimizer).to_be(0)
      end
    end
    expect(fits.none).to_be(0)
    expect(fits.full > 0).to_be(true)
    -- With the moments on the host, selective recompute fits too (the optimizer's 10 GiB
    -- a GPU leave its peak), and recompute none still does not.
    expect(offloaded.selective > 0).to_be(true)
    expect(offloaded.none).to_be(0)
  end)

  -- Offload under bf16 takes the matrices' f32 masters off the device too
  -- (AdamW:masters_on_host): 4 bytes an element of the stage's block matrices (and the
  -- untied head) leave the peak besides the moments (ZeRO-3: the shares); in fp32 none do.
  it("prices the f32 masters offload keeps on the host under bf16", function()
    local big = build(llama, { "train.model_name=llama3-70b", "train.batch_size=512",
                               "train.precision=bf16" })
    local h100 = plan.cluster("h100", { nodes = 8 })
    local lay = { tp = 4, pp = 8, dp = 2, cp = 1, v = 1, sp = true, micro_batch = 1,
                  schedule = "1f1b", zero = 0, recompute = "full" }
    local function with(over)
      local l = {}
      for k, v in pairs(lay) do l[k] = v end
      for k, v in pairs(over) do l[k] = v end
      return plan.evaluate(big, l, h100)
    end
    local on, off = with({ offload = true }), with({ offload = false })
    -- llama3-70b: 80 blocks over 8 stages; a block's matrices on a tp 4 rank
    local block_mm = (8192 * 8192 * 2 + 1024 * 8192 * 2 + 3 * 8192 * 28672) / 4
    local stage = on.mem.stage
    local blocks = 10
    local head = stage == 7 and 128256 * 8192 / 4 or 0
    expect(on.mem.host_masters).to_be(4 * (blocks * block_mm + head))
    expect(on.mem.released_masters).to_be(on.mem.host_masters)
    expect(off.mem.total - on.mem.total).to_be(off.mem.optimizer + on.mem.host_masters)
    -- ZeRO-1 and 2: the host keeps this rank's share (dp 2: half), the device drops the
    -- whole matrices all the same.
    for _, z in ipairs({ 1, 2 }) do
      local zon, zoff = with({ offload = true, zero = z }), with({ offload = false, zero = z })
      expect(zon.mem.released_masters).to_be(4 * (blocks * block_mm + head))
      expect(zon.mem.host_masters).to_be(zon.mem.released_masters / 2)
      expect(zoff.mem.total - zon.mem.total)
        .to_be(zoff.mem.optimizer + zon.mem.released_masters)
    end
    -- ZeRO-3: the host keeps every share of this rank's (dp 2: half of each parameter);
    -- the device drops the shares' f32 buffers, keeping a bf16 copy of each block's share
    -- (half its bytes) and the block's norm weights whole in f32 (the gathers' sources).
    local zon, zoff = with({ offload = true, zero = 3 }), with({ offload = false, zero = 3 })
    local zstage = zon.mem.stage
    local block = block_mm + 2 * 8192
    local root = (zstage == 0 or zstage == 7) and 128256 * 8192 / 4 or 0
    if zstage == 7 then root = root + 8192 end
    expect(zon.mem.host_masters).to_be(4 * math.ceil((blocks * block + root) / 2))
    -- (each buffer as the allocator's size classes grant it)
    local granted = require("tetra.planner.model").granted
    local want = granted(4 * root / 2) +
                 blocks * (granted(4 * block / 2) - granted(2 * block / 2) - granted(4 * 2 * 8192))
    expect(zon.mem.released_masters).to_be(want)
    expect(zoff.mem.total - zon.mem.total).to_be(zoff.mem.optimizer + zon.mem.released_masters)
    -- The host update of whole weights hides behind the next step's forward while it is
    -- the shorter (AdamW:overlap_with): a faster host changes nothing then; ZeRO's shards
    -- are updated before their gather, in the open, so there it shows.
    local function at_host_bw(bw, over)
      local c = {}
      for k, v in pairs(h100) do c[k] = v end
      c.host_bw = bw
      local l = {}
      for k, v in pairs(lay) do l[k] = v end
      for k, v in pairs(over) do l[k] = v end
      return plan.evaluate(big, l, c).step_s
    end
    expect(at_host_bw(1e13, { offload = true })).to_be(at_host_bw(2e13, { offload = true }))
    expect(at_host_bw(1e13, { offload = true, zero = 1 }) >
           at_host_bw(2e13, { offload = true, zero = 1 })).to_be(true)
  end)

  -- The mission's scale: 175B and 405B on 1,024 H100s. Meta's Llama 3 405B layout (tp 8,
  -- pp 16, dp 8 here) fits with ZeRO-2 and full recompute and with neither it does not;
  -- GPT-3 175B fits as tp 8 x pp 8 x dp 16 with ZeRO-2 alone.
  it("fits GPT-3 175B and Llama 3 405B on 1,024 H100s", function()
    local h100 = plan.cluster("h100", { nodes = 128 })
    local function at(recipe, name, batch, lay)
      local c = build(recipe, { "train.model_name=" .. name, "train.batch_size=" .. batch })
      local base = { tp = 8, cp = 1, v = 1, sp = true, micro_batch = 1, schedule = "1f1b" }
      for k, v in pairs(lay) do base[k] = v end
      return plan.evaluate(c, base, h100)
    end
    local fit405 = at(llama, "llama3-405b", 2048, { pp = 16, dp = 8, zero = 2, recompute = "full" })
    expect(fit405.fits).to_be(true)
    expect(fit405.mem_gib < 60).to_be(true)
    expect(at(llama, "llama3-405b", 2048, { pp = 16, dp = 8, zero = 0, recompute = "none" }).fits)
      .to_be(false)
    local fit175 = at(gpt2, "gpt3-175b", 1152, { pp = 8, dp = 16, zero = 2, recompute = "none" })
    expect(fit175.fits).to_be(true)
    expect(at(gpt2, "gpt3-175b", 1152, { pp = 8, dp = 16, zero = 0, recompute = "none" }).fits)
      .to_be(false)
  end)

  it("marks a layout that does not fit", function()
    local big = plan.cluster("cpu", { devices_per_node = 2, mem_bytes = 1e6 })
    local rows = plan.search(cfg, big)
    expect(rows[1].fits).to_be(false)
  end)
end)

describe("plan against published runs", function()
  it("reproduces every published row within 15%", function()
    for _, row in ipairs(published.rows) do
      local _, v = published.predict(row)
      local err = (v - row.value) / row.value
      if math.abs(err) > 0.15 then
        error(string.format("%s: predicted %.3f, published %.3f (%+.0f%%)", row.name, v,
                            row.value, 100 * err), 0)
      end
    end
  end)

  it("predicts torch.compile faster than eager, as torchtitan measured", function()
    local eager, compiled = {}, {}
    for _, row in ipairs(published.rows) do
      if row.source == "torchtitan" then
        local _, v = published.predict(row)
        local t = row.engine == "torchtitan_compile" and compiled or eager
        t[row.dp] = v
      end
    end
    for _, gpus in ipairs({ 8, 128 }) do
      local ratio = compiled[gpus] / eager[gpus]
      expect(ratio > 1.1 and ratio < 1.3).to_be(true)   -- published: 1.157, 1.162
    end
  end)
end)

describe("plan framework inputs", function()
  -- Llama 3.1 8B on one device (no communication): what each input adds to the step.
  local m = { family = "llama", dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 8,
              ffn_hidden = 14336, vocab_size = 128256, seq_len = 8192 }
  local cfg = { model = m, train = { batch_size = 2, precision = "bf16" }, parallel = {} }
  local function step(recompute, over)
    local cl = plan.cluster("h100_500w", over)
    local lay = { tp = 1, cp = 1, dp = 1, pp = 1, v = 1, zero = 0, sp = false, micro_batch = 2,
                  schedule = "1f1b", recompute = recompute }
    return plan.evaluate(cfg, lay, cl).step_s
  end
  local n, d, f, dkv = 2 * 8192, 4096, 14336, 1024
  local cl = plan.cluster("h100_500w")
  local rate_mm = cl.peak_flops * cl.matmul * cl.sustained
  local rate_bw = cl.mem_bw * cl.sustained
  -- The fused elementwise count's bytes per token of one block's forward.
  local fused = (10 * d + 2 * (d + dkv) + 3 * f) * 2

  it("selective recompute reruns wk, wo and w3 (every second matmul) and the elementwise ops", function()
    local rerun = 2 * n * (dkv * d + d * d + f * d) / rate_mm + n * fused / rate_bw
    local got = step("selective_op") - step("none")
    expect(math.abs(got - 32 * rerun) < 1e-9 * got).to_be(true)
  end)

  it("eager elementwise kernels move torchtitan's op-by-op bytes", function()
    -- Counted by hand from torchtitan's Llama block: two fp32 RMSNorms (36 bytes an
    -- element each), fp32 RoPE on q and k (20), repeat_kv, the contiguous attention
    -- output, two residual adds, SwiGLU: 112 d + 24 d_kv + 10 f bytes a token, forward;
    -- backward twice that.
    local eager = 112 * d + 24 * dkv + 10 * f
    expect(eager).to_be(626688)
    local got = step("none", { elementwise = "eager" }) - step("none")
    local want = 32 * 3 * n * (eager - fused) / rate_bw
    expect(math.abs(got - want) < 1e-9 * got).to_be(true)
  end)

  it("refuses eager elementwise counts for a model it has not counted", function()
    local g = { family = "gpt2", dim = 64, n_layers = 1, n_heads = 2, n_kv_heads = 2,
                ffn_hidden = 256, vocab_size = 128, seq_len = 16 }
    local ok, err = pcall(plan.evaluate, { model = g, train = { batch_size = 1 }, parallel = {} },
      { tp = 1, cp = 1, dp = 1, pp = 1, v = 1, zero = 0, sp = false, micro_batch = 1,
        schedule = "1f1b", recompute = "none" }, plan.cluster("h100", { elementwise = "eager" }))
    expect(ok).to_be(false)
    expect(tostring(err):match("elementwise = eager is counted for the llama family only") ~= nil)
      .to_be(true)
  end)
end)

describe("plan links between nodes", function()
  -- A cluster's own links (tetra plan --inter-gbps, --inter-latency-us; the namespace
  -- cluster's shaped links in tools/bench/multinode.sh): a data-parallel group across
  -- nodes pays its ring all-reduce at inter_bw and inter_latency_s, one inside a node at
  -- intra_bw and latency_s. The links are slow enough here that the reduction outlasts
  -- the backward it overlaps: the exposed time is the whole all-reduce less that work.
  local sets = { "model.dim=256", "model.n_layers=4", "model.n_heads=8", "model.n_kv_heads=4",
                 "model.ffn_hidden=768", "model.vocab_size=4096", "model.seq_len=128",
                 "train.batch_size=8", "parallel.data_parallel_size=2" }
  local cfg = build(llama, sets)
  local lay = plan.layout_of(cfg)
  local grad_bytes = 4 * plan.parameter_count(cfg.model)
  local function across(over)   -- 2 nodes of 1 device: the dp group crosses the network
    over.nodes, over.devices_per_node = 2, 1
    return plan.evaluate(cfg, lay, plan.cluster("cpu", over))
  end

  it("prices the all-reduce across nodes at the inter-node bandwidth", function()
    local slow = across({ inter_bw = 100e6 / 8 })   -- 100 Mbit/s
    local fast = across({ inter_bw = 200e6 / 8 })
    -- 2 ranks: a ring all-reduce sends and receives the whole gradient once per rank.
    expect(slow.exposed_comm_s - fast.exposed_comm_s)
      .to_be_near(grad_bytes / (100e6 / 8) - grad_bytes / (200e6 / 8), 1e-9)
    expect(slow.step_s - fast.step_s).to_be_near(slow.exposed_comm_s - fast.exposed_comm_s, 1e-9)
  end)

  it("prices each step of it at the inter-node latency, not the one inside a node", function()
    local base = across({ inter_bw = 100e6 / 8 })
    local far = across({ inter_bw = 100e6 / 8, inter_latency_s = 1e-3 })
    -- 2 ranks: reduce-scatter and all-gather, one step each, from 12 us to 1 ms.
    expect(far.exposed_comm_s - base.exposed_comm_s).to_be_near(2 * (1e-3 - 12e-6), 1e-9)
    expect(across({ inter_bw = 100e6 / 8, latency_s = 1e-3 }).exposed_comm_s)
      .to_be_near(far.exposed_comm_s, 1e-12)   -- unset, it follows latency_s
  end)

  it("leaves a group inside one node alone", function()
    local one = { devices_per_node = 2 }
    local other = { devices_per_node = 2, inter_bw = 1e3, inter_latency_s = 1 }
    expect(plan.evaluate(cfg, lay, plan.cluster("cpu", other)).step_s)
      .to_be(plan.evaluate(cfg, lay, plan.cluster("cpu", one)).step_s)
  end)

  it("takes them from tetra plan's options, refused with one line when malformed", function()
    local cli = require("tetra.cli.plan")
    local o = cli.parse({ "--inter-gbps", "0.1", "--inter-latency-us", "40" })
    expect(o.over.inter_bw).to_be_near(12.5e6, 1e-6)
    expect(o.over.inter_latency_s).to_be_near(40e-6, 1e-18)
    expect(plan.cluster("cpu", o.over).latency_s).to_be(12e-6)   -- inside a node: unchanged
    for _, bad in ipairs({ { "--inter-gbps", "fast" }, { "--inter-gbps", "0" },
                           { "--inter-latency-us", "-5" }, { "--inter-gbps" } }) do
      local none, err = cli.parse(bad)
      expect(none).to_be(nil)
      expect(err:match("^" .. bad[1]:gsub("%-", "%%-") .. " needs a positive number, got '") ~= nil)
        .to_be(true)
    end
    local none, err = cli.parse({ "--inter-gbps", "1", "--inter-gbs", "0.125" })
    expect(none).to_be(nil)
    expect(err).to_be("--inter-gbs and --inter-gbps both set the same figure: give one")
  end)
end)

describe("plan precision", function()
  local cli = require("tetra.cli.plan")
  local function cluster(name, sets, nodes)
    local cfg = build(llama, sets)
    local cl = cli.cluster_of({ cluster = name, over = { nodes = nodes or 1 },
                                preset_rates = true }, nil, cfg)
    return cfg, cl
  end

  it("prices the configuration's precision, and a GPU cluster's bf16 for the default fp32", function()
    local _, cl = cluster("h100", small)
    expect(cl.precision).to_be("bf16")
    _, cl = cluster("cpu", small)
    expect(cl.precision).to_be("fp32")
    local cfg16, cpu16 = cluster("cpu", { "train.precision=bf16", unpack(small) })
    expect(cpu16.precision).to_be("bf16")
    -- bf16 activations are narrower than fp32's (2 bytes an element but for the f32
    -- statistics: 0.63 of them here), and the parameters gain their bf16 copies
    local cfg32, cpu32 = cluster("cpu", small)
    local lay = plan.search(cfg32, cpu32, { fixed = { tp = 1, pp = 1, dp = 2, cp = 1 } })[1]
    local again = plan.search(cfg16, cpu16, { fixed = { tp = 1, pp = 1, dp = 2, cp = 1 } })
    local same
    for _, r in ipairs(again) do
      if r.micro_batch == lay.micro_batch and r.recompute == lay.recompute and
         r.zero_stage == lay.zero_stage then same = r end
    end
    expect(same.mem.activations < 0.7 * lay.mem.activations).to_be(true)
    expect(same.mem.params > lay.mem.params).to_be(true)
  end)

  it("prices fp8 GEMMs faster, with recompute weighed on GPUs as on the CPU", function()
    local sets = { "train.precision=fp8", unpack(small) }
    local cfg8, h8 = cluster("h100", sets)
    local cfg16, h16 = cluster("h100", { "train.precision=bf16", unpack(small) })
    local rows8, rows16 = plan.search(cfg8, h8), plan.search(cfg16, h16)
    local rc = {}
    for _, r in ipairs(rows8) do rc[r.recompute] = true end
    expect(rc.none and rc.selective and rc.full).to_be(true)
    -- the same layout in both: its GEMMs at the FP8 rate take less time
    local a = rows8[1]
    local b
    for _, r in ipairs(rows16) do
      if r.tp == a.tp and r.dp == a.dp and r.pp == a.pp and r.cp == a.cp and
         r.recompute == a.recompute and r.zero_stage == a.zero_stage and
         r.sequence_parallel == a.sequence_parallel and r.micro_batch == a.micro_batch and
         r.schedule == a.schedule and r.virtual == a.virtual then b = r end
    end
    expect(a.compute_s < b.compute_s).to_be(true)
    -- MFU against the FP8 peak, as a run measures it (tetra.obs.mfu)
    local flops = plan.flops_per_token(cfg8.model)
    expect(a.mfu).to_be_near(a.tokens_per_s * flops / (a.world * h8.fp8_flops), 1e-12)
    expect(b.mfu).to_be_near(b.tokens_per_s * flops / (b.world * h16.peak_flops), 1e-12)
    -- the written configs keep fp8 and run (the config checks pass), with recompute too
    local with_rc
    for _, r in ipairs(rows8) do
      if r.recompute ~= "none" then with_rc = with_rc or r end
    end
    for _, r in ipairs({ rows8[1], with_rc }) do
      local path = os.tmpname() .. ".yaml"
      local f = assert(io.open(path, "w"))
      f:write(plan.yaml(cfg8, r, h8))
      f:close()
      local _, loaded = config.load(path, { "train.device=cuda" }, { world_size = r.world })
      os.remove(path)
      expect(loaded.train.precision).to_be("fp8")
      expect(loaded.train.recompute).to_be(r.recompute)
    end
    -- and the out-of-memory advice of tetra run's fit check suggests recompute for fp8 on
    -- cuda where it does for bf16
    local fit = require("tetra.config.fit")
    local gpu8 = build(llama, { "train.precision=fp8", "train.device=cuda",
                                "train.batch_size=8", "model.n_layers=4", unpack(small, 1, 7) })
    local gpu16 = build(llama, { "train.precision=bf16", "train.device=cuda",
                                 "train.batch_size=8", "model.n_layers=4", unpack(small, 1, 7) })
    local need = fit.estimate(gpu16, 1).mem.total
    local _, advice16 = fit.cheapest(gpu16, 1, 0.6 * need)
    expect(advice16:find("train.recompute=", 1, true) ~= nil).to_be(true)
    local advised = 0
    for k = 7, 19 do   -- 35% to 95% of what the layout needs
      local _, advice8 = fit.cheapest(gpu8, 1, k * 0.05 * need)
      if advice8 and advice8:find("train.recompute=", 1, true) then advised = advised + 1 end
    end
    expect(advised >= 1).to_be(true)
    -- on the CPU too
    local _, cpu8 = cluster("cpu", sets)
    local cpu_rc = {}
    for _, r in ipairs(plan.search(cfg8, cpu8)) do cpu_rc[r.recompute] = true end
    expect(cpu_rc.full).to_be(true)
  end)
end)
