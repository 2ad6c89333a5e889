-- The quick-start demo: a small Llama learns to write English from a real corpus in a few
-- minutes on 2 CPU cores, then prints a sample.
--
--   tetra run recipes/demo.lua                       (about 3 minutes on 2 cores)
--   tetra run recipes/demo.lua --set train.steps=50  (a quick look)
--
-- Corpus (Debian packages, installed by the setup): every fortune cookie file of
-- `fortunes` (/usr/share/games/fortunes) and the King James Bible of `bible-kjv`
-- (read through its `bible` command); the last 5% of each is held out for the eval loss.
-- Tokens: a byte-level BPE vocabulary of demo.vocab_size trained on the training text
-- when the run starts (under a second), through tetra.data's loader; or, with
-- --set demo.tokenizer=byte, one token per byte. Files go to demo.work_dir.
local tetra = require("tetra")
local train = tetra.train

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local llama = dofile(here .. "/llama/model.lua")

local FORTUNES = "/usr/share/games/fortunes"

local function read_command(cmd)
  local p = io.popen(cmd .. " 2>/dev/null")
  if not p then return "" end
  local s = p:read("*a")
  p:close()
  return s or ""
end

-- Training and held-out text: the fortune files (the .dat / .u8 indexes skipped) and the
-- whole KJV, each split 95 / 5.
local function corpus()
  local fortunes = {}
  for name in read_command("ls -1 " .. FORTUNES):gmatch("[^\n]+") do
    if not name:match("%.dat$") and not name:match("%.u8$") then
      local f = io.open(FORTUNES .. "/" .. name, "rb")
      if f then
        -- "%" lines separate fortunes; a blank line reads better in samples.
        fortunes[#fortunes + 1] = (f:read("*a") or ""):gsub("\n%%\n", "\n\n")
        f:close()
      end
    end
  end
  local parts = { table.concat(fortunes, "\n"), read_command("bible Gen1:1-Rev22:21") }
  if #parts[2] < 1000000 then   -- the corpus the summary names, or a clear line
    error("demo: the King James Bible is missing: install the Debian package bible-kjv " ..
          "(its `bible` command reads it; tools/setup installs it)", 0)
  end
  if #parts[1] + #parts[2] < 100000 then
    error("demo: corpus not found. Install the Debian packages fortunes and " ..
          "bible-kjv-text (tools/setup does), or train on your own text with " ..
          "`tetra run recipes/llama.lua --set data.mock=false --set data.input_path=FILE " ..
          "--set model.vocab_size=256`", 0)
  end
  local train_text, val_text = {}, {}
  for i, text in ipairs(parts) do
    local cut = math.floor(#text * 0.95)
    train_text[i], val_text[i] = text:sub(1, cut), text:sub(cut + 1)
  end
  return table.concat(train_text, "\n"), table.concat(val_text, "\n")
end

local function write_file(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

-- The data source and tokenizer of cfg.demo.tokenizer ("bpe" or "byte"), both through
-- tetra.data's pipeline; sets model.vocab_size to the tokenizer's.
local function demo_data(cfg, train_text, val_text)
  local d = cfg.demo
  assert(d.tokenizer == "bpe" or d.tokenizer == "byte", "demo.tokenizer must be bpe or byte")
  assert(os.execute("mkdir -p '" .. d.work_dir .. "'"), "demo: cannot create " .. d.work_dir)
  local train_path, val_path = d.work_dir .. "/train.txt", d.work_dir .. "/val.txt"
  write_file(train_path, train_text)
  write_file(val_path, val_text)
  cfg.data.input_path, cfg.data.val_path = train_path, val_path
  cfg.data.tokenizer = "byte"
  if d.tokenizer == "bpe" then
    tetra.data.train_tokenizer({ train_path }, d.vocab_size, d.work_dir)
    cfg.data.tokenizer = d.work_dir .. "/tokenizer.json"
  end
  local tok = tetra.data.tokenizer(cfg.data.tokenizer)
  cfg.model.vocab_size = tok:vocab_size()
  return tetra.data.source(cfg), tok
end

local recipe = {
  name = "demo",
  defaults = {
    model = { vocab_size = 2048, dim = 256, n_layers = 4, n_heads = 4, n_kv_heads = 4,
              ffn_hidden = 768, seq_len = 128, norm_eps = 1e-5, rope_theta = 10000.0,
              tie_embeddings = false, init_std = 0.02 },
    train = { steps = 300, batch_size = 16, lr = 2e-3, min_lr = 2e-4, warmup_steps = 20,
              lr_schedule = "cosine", weight_decay = 0.1, max_grad_norm = 1.0, seed = 0,
              eval_every = 50, eval_steps = 4, sample_tokens = 300, temperature = 0.8,
              top_k = 20, prompt = "The " },
    optim = { name = "adamw", beta1 = 0.9, beta2 = 0.95, eps = 1e-8 },
    data = { mock = false },
    log = { every = 10 },
    demo = { tokenizer = "bpe", vocab_size = 2048, work_dir = "runs/demo" },
  },
}

function recipe.setup(cfg)
  local train_text, val_text = corpus()
  local data, tok = demo_data(cfg, train_text, val_text)
  tetra.manual_seed(cfg.train.seed)
  local model = llama.Model(cfg.model)
  local env = train.setup(cfg, model, data, { tokenizer = tok, plan = llama.plan })
  env.corpus_bytes = #train_text + #val_text
  return env
end

function recipe.run(cfg)
  local env = recipe.setup(cfg)
  local m, t = cfg.model, cfg.train
  if env.rank == 0 then
    print(string.format("demo: %.1f MB of text (fortunes + King James Bible), %s tokens, " ..
                        "vocab %d", env.corpus_bytes / 1e6, cfg.demo.tokenizer,
                        m.vocab_size))
    print(string.format("model: Llama, %.2fM parameters (%d layers, dim %d, %d heads), " ..
                        "seq %d, batch %d, %d steps", env.model:num_params() / 1e6,
                        m.n_layers, m.dim, m.n_heads, m.seq_len, t.batch_size, t.steps))
  end
  local summary = train.run(env)
  if env.rank == 0 then
    print(string.format("loss %.3f -> %.3f (eval %.3f) in %.0f s", summary.first_loss,
                        summary.last_loss, summary.eval_loss or 0 / 0, summary.elapsed_s))
  end
  return 0
end

return recipe
