-- The quick-start demo: a small Llama learns to write English from a real corpus in a few
-- minutes on 2 CPU cores, then prints a sample.
--
--   tetra run recipes/demo.lua                       (about 3 minutes on 2 cores)
--   tetra run recipes/demo.lua --set train.steps=50  (a quick look)
--
-- Corpus (Debian packages, installed by the setup): every fortune cookie file of
-- `fortunes` (/usr/share/games/fortunes) and the King James Bible of `bible-kjv-text`
-- (read through its `bible` command). Tokens are bytes (vocab 256); the last 5% of the
-- text is held out for the eval loss.
local tetra = require("tetra")
local train, bytetok = tetra.train, require("tetra.bytetok")

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local llama = dofile(here .. "/llama.lua")

local FORTUNES = "/usr/share/games/fortunes"

local function read_command(cmd)
  local p = io.popen(cmd .. " 2>/dev/null")
  if not p then return "" end
  local s = p:read("*a")
  p:close()
  return s or ""
end

-- The fortune files (plain text; the .dat / .u8 indexes skipped) and the whole KJV.
local function corpus()
  local parts = {}
  for name in read_command("ls -1 " .. FORTUNES):gmatch("[^\n]+") do
    if not name:match("%.dat$") and not name:match("%.u8$") then
      local f = io.open(FORTUNES .. "/" .. name, "rb")
      if f then
        -- "%" lines separate fortunes; a blank line reads better in samples.
        local text = (f:read("*a") or ""):gsub("\n%%\n", "\n\n")
        f:close()
        parts[#parts + 1] = text
      end
    end
  end
  parts[#parts + 1] = read_command("bible Gen1:1-Rev22:21")
  local text = table.concat(parts, "\n")
  if #text < 100000 then
    error("demo: corpus not found. Install the Debian packages fortunes and " ..
          "bible-kjv-text (tools/setup does), or train on your own text with " ..
          "`tetra run recipes/llama.lua --set data.mock=false --set data.input_path=FILE " ..
          "--set model.vocab_size=256`", 0)
  end
  return text
end

local recipe = {
  name = "demo",
  defaults = {
    model = { vocab_size = 256, dim = 256, n_layers = 4, n_heads = 4, n_kv_heads = 4,
              ffn_hidden = 768, seq_len = 128, norm_eps = 1e-5, rope_theta = 10000.0,
              tie_embeddings = false, init_std = 0.02 },
    train = { steps = 300, batch_size = 16, lr = 2e-3, min_lr = 2e-4, warmup_steps = 20,
              lr_schedule = "cosine", weight_decay = 0.1, max_grad_norm = 1.0, seed = 0,
              eval_every = 50, eval_steps = 4, sample_tokens = 300, temperature = 0.8,
              top_k = 20, prompt = "The " },
    optim = { name = "adamw", beta1 = 0.9, beta2 = 0.95, eps = 1e-8 },
    data = { mock = false },
    log = { every = 10 },
  },
}

function recipe.setup(cfg)
  local text = corpus()
  local data = bytetok.dataset(text, { seed = cfg.data.seed or cfg.train.seed })
  tetra.manual_seed(cfg.train.seed)
  local model = llama.Model(cfg.model)
  local env = train.setup(cfg, model, data, { tokenizer = bytetok.tokenizer })
  env.corpus_bytes = #text
  return env
end

function recipe.run(cfg)
  local env = recipe.setup(cfg)
  local m, t = cfg.model, cfg.train
  if env.rank == 0 then
    print(string.format("demo: %.1f MB of text (fortunes + King James Bible), byte tokens",
                        env.corpus_bytes / 1e6))
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
