-- tetra.parallel.layout: every rule about the parallel layout, each broken one reported
-- as one line naming the keys, their values and the fix; a good layout has no problem.
local layout = require("tetra.parallel.layout")

-- A tiny Llama config with the given parallel sizes and overrides.
local function cfg(p, model, train)
  local c = {
    model = { dim = 64, n_layers = 4, n_heads = 4, n_kv_heads = 2, ffn_hidden = 128,
              vocab_size = 256, seq_len = 32 },
    train = { batch_size = 8, gradient_accumulation_steps = 2 },
    parallel = { order = "tp-cp-dp-pp" },
  }
  for k, v in pairs(p or {}) do c.parallel[k] = v end
  for k, v in pairs(model or {}) do c.model[k] = v end
  for k, v in pairs(train or {}) do c.train[k] = v end
  return c
end

local function one_problem(c, world, pattern)
  local problems = layout.problems(c, world)
  expect(#problems).to_be(1)
  expect(problems[1]).to_match(pattern)
end

describe("layout.sizes", function()
  it("reads the four sizes and the counts that follow, 1 where unset", function()
    expect(layout.sizes({})).to_equal({ tp = 1, cp = 1, dp = 1, pp = 1, world = 1, virtual = 1,
                                        micro_batches = 1 })
    expect(layout.sizes(cfg({ tensor_parallel_size = 2, data_parallel_size = 2,
                              pipeline_parallel_size = 3, virtual_pipeline_size = 2 })))
      .to_equal({ tp = 2, cp = 1, dp = 2, pp = 3, world = 12, virtual = 2, micro_batches = 2,
                  micro_batch = 2 })
    expect(layout.sizes(cfg({ context_parallel_size = 4 }, nil, { batch_size = 12,
                                                                 gradient_accumulation_steps = 3 })))
      .to_equal({ tp = 1, cp = 4, dp = 1, pp = 1, world = 4, virtual = 1, micro_batches = 3,
                  micro_batch = 4 })
  end)
end)

describe("layout.problems", function()
  it("accepts every dimension at once, with sequence parallelism and interleaving", function()
    expect(layout.problems(cfg({ tensor_parallel_size = 2, context_parallel_size = 2,
                                 data_parallel_size = 2, pipeline_parallel_size = 2,
                                 sequence_parallel = true, zero_stage = 1,
                                 pipeline_schedule = "interleaved_1f1b",
                                 virtual_pipeline_size = 2 }), 16)).to_equal({})
  end)

  it("takes ZeRO stages 0 to 3 and refuses 4 in one line", function()
    for z = 2, 3 do
      expect(layout.problems(cfg({ data_parallel_size = 2, tensor_parallel_size = 2,
                                   zero_stage = z }), 4)).to_equal({})
    end
    one_problem(cfg({ data_parallel_size = 2, zero_stage = 4 }), 2,
                "^parallel.zero_stage = 4 is not a stage: use 0, 1 %(AdamW state sharded%), " ..
                "2 %(gradients too%) or 3 %(parameters too%)$")
  end)

  it("refuses SGD under ZeRO (its buffers are not sharded), naming both keys", function()
    local c = cfg({ data_parallel_size = 2, zero_stage = 1 })
    c.optim = { name = "sgd" }
    one_problem(c, 2, "^parallel.zero_stage = 1 shards AdamW's state, and optim.name=sgd " ..
                      "keeps none in shards: set optim.name=adamw or parallel.zero_stage=0$")
    c.parallel.zero_stage = 0
    expect(layout.problems(c, 2)).to_equal({})
  end)

  it("refuses what ZeRO-3 cannot go with, naming the key to change", function()
    -- Offload goes with it (each rank's shares of the moments on the host).
    expect(#layout.problems(cfg({ data_parallel_size = 2, zero_stage = 3,
                                  offload_optimizer = true }), 2)).to_be(0)
    one_problem(cfg({ data_parallel_size = 2, zero_stage = 3 }, nil, { cuda_graphs = true }), 2,
                "set train.cuda_graphs=false or parallel.zero_stage <= 2$")
  end)

  it("names the process count a layout needs", function()
    one_problem(cfg({ tensor_parallel_size = 2, pipeline_parallel_size = 4,
                      data_parallel_size = 8 }, nil, { batch_size = 16 }), 4,
                "needs 64 processes %(data 8 x tensor 2 x pipeline 4 x context 1%) but 4 are running")
  end)

  it("splits heads, MLP units and the vocabulary only as far as they go", function()
    one_problem(cfg({ tensor_parallel_size = 8 }, { n_heads = 4, n_kv_heads = 4 }), nil,
                "parallel.tensor_parallel_size %(8%) must divide model.n_heads %(4%)")
    one_problem(cfg({ tensor_parallel_size = 4 }, { n_heads = 12, n_kv_heads = 3, dim = 48 }),
                nil, "must be a multiple of model.n_kv_heads %(3%)")
    one_problem(cfg({ tensor_parallel_size = 2 }, { ffn_hidden = 129 }), nil,
                "must divide model.ffn_hidden %(129%)")
    one_problem(cfg({ tensor_parallel_size = 4 }, { vocab_size = 5, n_kv_heads = 4 }), nil,
                "model.vocab_size %(5%) is too small")
    -- Fewer key/value heads than ranks, and a vocabulary tp does not divide, are fine.
    expect(layout.problems(cfg({ tensor_parallel_size = 4 }, { vocab_size = 255 }))).to_equal({})
  end)

  it("cuts sequences into whole chunks", function()
    one_problem(cfg({ context_parallel_size = 2 }, { seq_len = 30 }), nil,
                "model.seq_len %(30%) must be a multiple of 2 x parallel.context_parallel_size %(4%)")
    one_problem(cfg({ tensor_parallel_size = 4, sequence_parallel = true,
                      context_parallel_size = 2 }, { seq_len = 12 }), nil,
                "model.seq_len %(12%) / parallel.context_parallel_size %(2%) must be a multiple")
    one_problem(cfg({ sequence_parallel = true }), nil,
                "sequence_parallel=true needs parallel.tensor_parallel_size > 1")
  end)

  it("gives every stage a block and interleaving what it needs", function()
    one_problem(cfg({ pipeline_parallel_size = 8 }), nil,
                "model.n_layers %(4%) must be at least parallel.pipeline_parallel_size")
    one_problem(cfg({ pipeline_parallel_size = 2, pipeline_stages = { 1, 2 } }), nil,
                "pipeline_stages adds up to 3 layers, model.n_layers is 4")
    one_problem(cfg({ pipeline_parallel_size = 2, virtual_pipeline_size = 2 }), nil,
                "virtual_pipeline_size=2 needs parallel.pipeline_schedule=interleaved_1f1b")
    one_problem(cfg({ pipeline_parallel_size = 2, pipeline_schedule = "interleaved_1f1b",
                      virtual_pipeline_size = 2 }, nil, { gradient_accumulation_steps = 3,
                                                           batch_size = 6 }), nil,
                "must be a multiple of parallel.pipeline_parallel_size %(2%)")
  end)

  it("splits the batch into whole micro-batches", function()
    one_problem(cfg({ data_parallel_size = 2 }, nil, { batch_size = 6 }), nil,
                "train.batch_size %(6%) must be a multiple")
  end)

  it("config.check_layout raises the first problem as a config error", function()
    local config = require("tetra.config")
    local ok, e = pcall(config.check_layout, cfg({ context_parallel_size = 3 }), nil)
    expect(ok).to_be(false)
    expect(config.is_error(e)).to_be(true)
    expect(e.message).to_match("^config error: model.seq_len %(32%) must be a multiple")
    expect(function() config.check_layout(cfg({ context_parallel_size = 2 }), 3) end)
      .to_error("config error: this layout needs 2 processes")
  end)
end)

-- The device guard: every layout of tests/dist/layouts.txt, run on cuda, must find a CUDA
-- kernel for each family its step dispatches, and the table that says so must match the
-- CUDA sources (a family whose .cu goes away fails here, on a machine without a GPU).
describe("layout.device_problem", function()
  local source = require("tetra.host").source_dir

  local function read(path)
    local f = assert(io.open(source .. "/" .. path, "r"), "cannot read " .. path)
    local text = f:read("*a")
    f:close()
    return text
  end

  -- The config of one layouts.txt row (layout and common settings), on cuda.
  local function row_config(layout_col, common_col)
    local c = { train = { device = "cuda" }, parallel = {}, model = {} }
    for _, col in ipairs({ common_col, layout_col }) do
      for kv in col:gmatch("%S+") do
        local key, value = kv:match("^([%w_.]+)=(.*)$")
        if key then
          local section, name = key:match("^(%w+)%.(.+)$")
          if c[section] then
            local v = tonumber(value)
            if value == "true" then v = true elseif value == "false" then v = false end
            c[section][name] = v == nil and value or v
          end
        end
      end
    end
    return c
  end

  it("accepts every row of tests/dist/layouts.txt on cuda", function()
    local rows = 0
    for line in read("tests/dist/layouts.txt"):gmatch("[^\n]+") do
      if not line:match("^%s*#") and line:match("%S") then
        local cols = {}
        for col in (line .. "|"):gmatch("([^|]*)|") do cols[#cols + 1] = col end
        local c = row_config(cols[4], cols[5])
        local name = cols[1]:match("%S+")
        expect({ name, layout.device_problem(c) }).to_equal({ name })
        rows = rows + 1
      end
    end
    expect(rows > 50).to_be(true)
  end)

  it("claims only CUDA kernels that the sources define and link in", function()
    local linked = read("engine/cuda/kernels_linked.cu")
    local families = {}
    for fam in linked:match("#define FAMILIES%(X%)(.-)\n\n"):gmatch("X%((%w[%w_]*)%)") do
      families[fam] = true
      expect({ fam, layout.cuda_kernels[fam] ~= nil }).to_equal({ fam, true })
    end
    for fam in pairs(layout.cuda_kernels) do
      expect({ fam, families[fam] == true }).to_equal({ fam, true })
      local defined = false
      for _, dir in ipairs({ "kernels/cuda/", "engine/cuda/" }) do
        local f = io.open(source .. "/" .. dir .. fam .. ".cu", "r")
        if f then
          defined = defined or f:read("*a"):find("TT_CUDA_FAMILY(" .. fam .. ")", 1, true) ~= nil
          f:close()
        end
      end
      expect({ fam, defined }).to_equal({ fam, true })
    end
  end)

  it("refuses a step whose kernel has no CUDA implementation, in one line", function()
    local c = cfg({ tensor_parallel_size = 2 }, nil, { device = "cuda", precision = "bf16" })
    expect(layout.problems(c, 2)).to_equal({})
    local saved = layout.cuda_kernels.vocab_parallel
    layout.cuda_kernels.vocab_parallel = { f32 = true }
    local ok, problems = pcall(layout.problems, c, 2)
    layout.cuda_kernels.vocab_parallel = saved
    expect(ok).to_be(true)
    expect(#problems).to_be(1)
    expect(problems[1]).to_match("^train.device=cuda: the loss under " ..
                                 "parallel.tensor_parallel_size=2 runs the vocab_parallel " ..
                                 "kernels in bf16, which have no CUDA implementation")
    expect(layout.device_problem(cfg({ tensor_parallel_size = 2 }, nil, { device = "cpu" })))
      .to_be(nil)
  end)
end)
