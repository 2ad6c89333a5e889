-- Configuration: YAML loading, presets, precedence, validation messages.
local config = require("tetra.config")
local host = require("tetra.host")

local root = host.root

local function config_error(fn)
  local ok, err = pcall(fn)
  expect(ok).to_be(false)
  expect(config.is_error(err)).to_be(true)
  return err.message
end

local function tmp_yaml(text)
  local path = os.tmpname() .. ".yaml"
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

describe("YAML", function()
  it("reads scalars with YAML types and keeps quoted strings as strings", function()
    local t = host.parse_yaml([[
a: 8
b: 3.0e-4
c: 1e-5
d: true
e: "8"
f: hello world
g: [1, two, 3.5]
h: {x: 1}
i: null
j: -2
k: 0x10
]])
    expect(t.a).to_be(8)
    expect(t.b).to_be(3e-4)
    expect(t.c).to_be(1e-5)
    expect(t.d).to_be(true)
    expect(t.e).to_be("8")
    expect(t.f).to_be("hello world")
    expect(t.g).to_equal({ 1, "two", 3.5 })
    expect(t.h).to_equal({ x = 1 })
    expect(t.i).to_be_nil()
    expect(t.j).to_be(-2)
    expect(t.k).to_be("0x10")
  end)

  it("reports syntax errors with a line number", function()
    local t, err = host.parse_yaml("a: [1, 2\nb: 3\n")
    expect(t).to_be_nil()
    expect(err).to_match("line %d")
  end)

  it("loads the deployment guide's example config", function()
    local y = config.load_yaml(root .. "/recipes/configs/llama-7b.yaml")
    expect(y.train.model_name).to_be("llama-7b")
    expect(y.parallel.data_parallel_size).to_be(8)
    expect(y.parallel.tensor_parallel_size).to_be(2)
    expect(y.parallel.pipeline_parallel_size).to_be(4)
  end)
end)

describe("building a config", function()
  it("fills defaults and the preset's published shapes", function()
    local cfg = config.build({ yaml = { train = { model_name = "llama-7b" } }, world_size = 1 })
    expect(cfg.model.dim).to_be(4096)
    expect(cfg.model.n_layers).to_be(32)
    expect(cfg.model.ffn_hidden).to_be(11008)
    expect(cfg.model.vocab_size).to_be(32000)
    expect(cfg.train.precision).to_be("fp32")
    expect(cfg.parallel.tensor_parallel_size).to_be(1)
    local g = config.build({ yaml = { model = { name = "gpt2-124m" } }, world_size = 1 })
    expect(g.model.dim).to_be(768)
    expect(g.model.vocab_size).to_be(50257)
    expect(g.model.tie_embeddings).to_be(true)
  end)

  it("applies recipe defaults < preset < YAML < --set", function()
    local defaults = { train = { lr = 1, steps = 5, batch_size = 4 }, model = { dim = 64, n_layers = 2,
      n_heads = 4, vocab_size = 256, seq_len = 32 } }
    local cfg = config.build({ defaults = defaults, yaml = { train = { lr = 2, steps = 7 } },
                               sets = { "train.steps=9", "train.seed=5" }, world_size = 1 })
    expect(cfg.train.lr).to_be(2)
    expect(cfg.train.steps).to_be(9)
    expect(cfg.train.seed).to_be(5)
    expect(cfg.train.batch_size).to_be(4)
    -- A preset named by the user overrides the recipe's model defaults ...
    local p = config.build({ defaults = defaults, sets = { "train.model_name=llama-tiny", "model.n_layers=3" },
                             world_size = 1 })
    expect(p.model.dim).to_be(256)
    expect(p.model.n_layers).to_be(3)
    -- ... one named by the recipe defaults sits below them.
    local d = config.merge(defaults, { train = { model_name = "llama-tiny" } })
    local q = config.build({ defaults = d, world_size = 1 })
    expect(q.model.dim).to_be(64)
    expect(q.model.ffn_hidden).to_be(768)
  end)

  it("derives n_kv_heads, the Llama ffn size and the micro-batch", function()
    local cfg = config.build({ yaml = { model = { family = "llama", dim = 512, n_layers = 2, n_heads = 8,
      vocab_size = 100, seq_len = 16 }, train = { batch_size = 16, gradient_accumulation_steps = 2 } },
      world_size = 1 })
    expect(cfg.model.n_kv_heads).to_be(8)
    -- 8 * 512 / 3 = 1365 -> next multiple of 256
    expect(cfg.model.ffn_hidden).to_be(1536)
    expect(cfg.train.micro_batch_size).to_be(8)
  end)

  it("parses --set values as numbers, booleans, lists or strings", function()
    expect(config.parse_value("8")).to_be(8)
    expect(config.parse_value("3e-4")).to_be(3e-4)
    expect(config.parse_value("true")).to_be(true)
    expect(config.parse_value("a/b.txt")).to_be("a/b.txt")
    expect(config.parse_value("[a.txt, b.txt]")).to_equal({ "a.txt", "b.txt" })
    expect(config.parse_value("key: v")).to_be("key: v")
  end)

  it("lets modules register keys with defaults", function()
    config.register("dist", { spec_test_knob = 3 })
    local cfg = config.build({ world_size = 1 })
    expect(cfg.dist.spec_test_knob).to_be(3)
    local msg = config_error(function() config.build({ sets = { "dist.spec_test_knob=x" }, world_size = 1 }) end)
    expect(msg).to_match("dist.spec_test_knob must be a number")
    config.schema.dist.spec_test_knob = nil
  end)
end)

describe("model families as folders", function()
  it("finds every recipes/*/ with a model.lua, its presets and its rules", function()
    local models = require("tetra.models")
    expect(table.concat(models.names(), " ")).to_be("gpt2 llama qwen2")
    expect(config.schema.model.family.values).to_equal(models.names())
    local q = config.build({ yaml = { train = { model_name = "qwen2-0.5b" } }, world_size = 1 })
    expect(q.model.family).to_be("qwen2")
    expect(q.model.dim).to_be(896)
    expect(q.model.n_kv_heads).to_be(2)
    expect(q.model.tie_embeddings).to_be(true)
    expect(q.model.rope_theta).to_be(1000000)
    -- qwen2/presets.lua's rules: Llama's ffn size, untied by default, an even head size.
    local d = config.build({ yaml = { model = { family = "qwen2", dim = 512, n_layers = 2,
      n_heads = 8, vocab_size = 100, seq_len = 16 } }, world_size = 1 })
    expect(d.model.ffn_hidden).to_be(1536)
    expect(d.model.tie_embeddings).to_be(false)
    local g = config.build({ yaml = { model = { family = "gpt2", dim = 64, n_layers = 2,
      n_heads = 4, vocab_size = 100, seq_len = 16 } }, world_size = 1 })
    expect(g.model.ffn_hidden).to_be(256)
    expect(g.model.tie_embeddings).to_be(true)
    local msg = config_error(function()
      config.build({ yaml = { model = { family = "qwen2", dim = 36, n_layers = 1, n_heads = 4,
        vocab_size = 10, seq_len = 4 } }, world_size = 1 })
    end)
    expect(msg).to_match("must be even for rotary embeddings")
    msg = config_error(function()
      config.build({ sets = { "model.family=mistral" }, world_size = 1 })
    end)
    expect(msg).to_match("model.family must be one of gpt2, llama, qwen2")
  end)

  it("runs a YAML of a folder-only family through recipes/NAME/model.lua", function()
    local path = tmp_yaml("train:\n  model_name: qwen2-0.5b\n")
    local recipe, cfg = config.load(path, { "model.n_layers=1" }, { world_size = 1 })
    os.remove(path)
    expect(recipe.name).to_be("qwen2")
    expect(cfg.model.family).to_be("qwen2")
    expect(config.find_recipe("qwen2", ".")).to_match("/recipes/qwen2/model%.lua$")
    expect(config.find_recipe("llama", ".")).to_match("/recipes/llama%.lua$")
  end)
end)

describe("validation errors", function()
  it("names unknown keys and suggests the nearest", function()
    local msg = config_error(function() config.build({ sets = { "train.batchsize=8" }, world_size = 1 }) end)
    expect(msg).to_be("config error: unknown key 'train.batchsize' (did you mean 'train.batch_size'?)")
    msg = config_error(function() config.build({ yaml = { train = { dim = 8 } }, world_size = 1 }) end)
    expect(msg).to_match("did you mean 'model.dim'")
    msg = config_error(function() config.build({ yaml = { trian = {} }, world_size = 1 }) end)
    expect(msg).to_match("unknown section 'trian' %(did you mean 'train'%?%)")
  end)

  it("rejects impossible values, naming the key", function()
    local base = { train = { model_name = "llama-tiny" } }
    local cases = {
      { "train.batch_size=-4", "train.batch_size must be >= 1, got -4" },
      { "train.batch_size=2.5", "train.batch_size must be an integer" },
      { "model.n_heads=3", "model.n_heads (3) must divide model.dim (256)" },
      { "model.n_kv_heads=3", "model.n_kv_heads (3) must divide model.n_heads (4)" },
      { "train.precision=fp64", "train.precision must be one of fp32, bf16, fp16, fp8" },
      { "train.model_name=llama-70b", "unknown model preset 'llama-70b'" },
      { "parallel.order=tp-dp-pp", "parallel.order must name tp, cp, dp and pp" },
      { "data.mock=maybe", "data.mock must be true or false" },
    }
    for _, c in ipairs(cases) do
      local msg = config_error(function() config.build({ yaml = base, sets = { c[1] }, world_size = false }) end)
      expect(msg).to_match(c[2]:gsub("[%(%)%.%-%+]", "%%%0"))
    end
  end)

  it("takes a warmup-stable-decay schedule's keys with it alone, and a decay that fits", function()
    local base = { train = { model_name = "llama-tiny", steps = 100, warmup_steps = 10 } }
    local cfg = config.build({ yaml = base, world_size = false, sets = {
      "train.lr_schedule=wsd", "train.lr_decay_steps=90", "train.lr_decay_shape=sqrt" } })
    expect(cfg.train.lr_decay_steps).to_be(90)
    expect(cfg.train.lr_decay_shape).to_be("sqrt")
    local cases = {
      { { "train.lr_schedule=wsd" }, "train.lr_schedule=wsd needs train.lr_decay_steps" },
      { { "train.lr_schedule=wsd", "train.lr_decay_steps=91" },
        "train.lr_decay_steps (91) must not exceed train.steps - train.warmup_steps (90)" },
      { { "train.lr_schedule=wsd", "train.lr_decay_steps=0" }, "train.lr_decay_steps must be >= 1" },
      { { "train.lr_schedule=wsd", "train.lr_decay_steps=5", "train.lr_decay_shape=exp" },
        "train.lr_decay_shape must be one of linear, cosine, sqrt" },
      { { "train.lr_decay_steps=20" },
        "train.lr_decay_steps applies to train.lr_schedule=wsd (this run's is cosine)" },
      { { "train.lr_schedule=linear", "train.lr_decay_shape=cosine" },
        "train.lr_decay_shape applies to train.lr_schedule=wsd (this run's is linear)" },
    }
    for _, c in ipairs(cases) do
      local msg = config_error(function() config.build({ yaml = base, sets = c[1], world_size = false }) end)
      expect(msg).to_match(c[2]:gsub("[%(%)%.%-%+]", "%%%0"))
    end
  end)

  it("refuses a save delay the chosen kind of save would ignore", function()
    local function msg(sets)
      return config_error(function()
        config.build({ sets = sets, world_size = 1 })
      end)
    end
    expect(msg({ "checkpoint.dir=/tmp/ck", "checkpoint.async=true", "checkpoint.save_delay_ms=5" })).to_match(
      "^config error: checkpoint%.save_delay_ms holds back synchronous saves; with checkpoint%.async=true use checkpoint%.async_delay_ms")
    expect(msg({ "checkpoint.dir=/tmp/ck", "checkpoint.async_delay_ms=5" })).to_match(
      "^config error: checkpoint%.async_delay_ms holds back the writer thread of checkpoint%.async=true")
    local cfg = config.build({ sets = { "checkpoint.dir=/tmp/ck", "checkpoint.save_delay_ms=5" }, world_size = 1 })
    expect(cfg.checkpoint.save_delay_ms).to_be(5)
  end)

  it("checks the layout against the model and the batch", function()
    local msg = config_error(function()
      config.build({ yaml = { train = { model_name = "llama-tiny", batch_size = 8, gradient_accumulation_steps = 3 } },
                     world_size = 1 })
    end)
    expect(msg).to_match("must be a multiple of train.gradient_accumulation_steps")
    msg = config_error(function()
      config.build({ yaml = { train = { model_name = "llama-tiny" }, parallel = { tensor_parallel_size = 3 } },
                     world_size = false })
    end)
    expect(msg).to_match("parallel.tensor_parallel_size %(3%) must divide model.n_heads %(4%)")
  end)

  it("says how many processes the guide's 7B layout needs", function()
    local y = config.load_yaml(root .. "/recipes/configs/llama-7b.yaml")
    local msg = config_error(function() config.build({ yaml = y, world_size = 1 }) end)
    expect(msg).to_match("this layout needs 64 processes %(data 8 x tensor 2 x pipeline 4 x context 1%)")
    expect(msg).to_match("mpirun %-np 64")
    local cfg = config.build({ yaml = y, world_size = 64 })
    expect(cfg.train.micro_batch_size).to_be(8)
    expect(cfg.model.n_heads).to_be(32)
  end)
end)

describe("data the user names", function()
  local tiny = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") ..
                      "/../../recipes/tiny.lua")
  it("trains instead of the recipe's mock tokens; both at once is an error", function()
    local cfg = config.build({ defaults = tiny.defaults, world_size = false })
    expect(cfg.data.mock).to_be(true)                      -- the recipe's default
    cfg = config.build({ defaults = tiny.defaults, world_size = false,
                         sets = { "data.input_path=corpus.txt" } })
    expect(cfg.data.mock).to_be(false)
    cfg = config.build({ defaults = tiny.defaults, world_size = false,
                         yaml = { data = { input_path = "corpus.txt" } } })
    expect(cfg.data.mock).to_be(false)
    expect(function()
      config.build({ defaults = tiny.defaults, world_size = false,
                     sets = { "data.input_path=corpus.txt", "data.mock=true" } })
    end).to_error("data.mock=true and data.input_path")
  end)
end)

describe("train.cuda_graphs", function()
  it("is off by default and refused with one line where it cannot do what it says", function()
    local cfg = config.build({ world_size = 1 })
    expect(cfg.train.cuda_graphs).to_be(false)
    expect(config_error(function()
      config.build({ world_size = 1, sets = { "train.cuda_graphs=true" } })
    end)).to_match("^config error: train%.cuda_graphs replays GPU work and needs train%.device=cuda")
    local function refused(extra)
      local sets = { "train.cuda_graphs=true", "train.device=cuda" }
      for _, s in ipairs(extra) do sets[#sets + 1] = s end
      return config_error(function() config.build({ world_size = false, sets = sets }) end)
    end
    expect(refused({ "parallel.pipeline_parallel_size=2" })).to_match(
      "^config error: train%.cuda_graphs: parallel%.pipeline_parallel_size=2: collectives are polled from the host")
    expect(refused({ "parallel.data_parallel_size=2" })).to_match(
      "^config error: train%.cuda_graphs: parallel%.data_parallel_size=2: collectives are polled from the host")
    expect(refused({ "optim.name=sgd" })).to_match(
      "^config error: train%.cuda_graphs: optim%.name=sgd takes its learning rate as a kernel")
    expect(refused({ "train.inject_nan_step=3" })).to_match(
      "^config error: train%.cuda_graphs: train%.inject_nan_step poisons steps from the host")
    -- what it can capture: one process, any precision, AdamW
    for _, precision in ipairs({ "fp32", "bf16", "fp16", "fp8" }) do
      cfg = config.build({ world_size = 1, sets = { "train.cuda_graphs=true", "train.device=cuda",
                                                    "train.precision=" .. precision,
                                                    "train.spike_zscore=3" } })
      expect(cfg.train.cuda_graphs).to_be(true)
    end
  end)
end)
