-- A recipe for generate.sh: the tiny Llama (or GPT-2, with its learned positions and
-- tied head, with --set generate.gpt2=true), as initialised (the same seed gives every
-- layout the same whole model before it is split), continues a 5-token prompt by 30
-- greedy tokens in the layout --set gives (the window slides past seq_len 32 at the end;
-- under sequence parallelism odd lengths are padded). Every rank prints the ids it got
-- and the model's evaluation loss on two mock batches;
-- the rank that draws with tp, dp and cp coordinates 0 writes each draw's logits to
-- generate.out. generate.prompt (ids, space-separated) and generate.tokens change the
-- prompt and the length; generate.follow (a file of ids, space-separated) makes each draw
-- continue the prompt and the followed ids before it (teacher forcing), so that two models
-- can be compared on one sequence after their greedy draws part: the ids printed are
-- still the model's own picks. generate.eval = false leaves out the evaluation (a text
-- source holds out no batches unless data.eval_fraction says so).
local tetra = require("tetra")
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")
local gpt2 = dofile(here .. "/../../recipes/gpt2.lua")

local defaults = {}
for k, v in pairs(tiny.defaults) do defaults[k] = v end
defaults.generate = { out = "", gpt2 = false, prompt = "10 20 30 40 50", tokens = 30,
                      follow = "", eval = true }

local recipe = { name = "generate", defaults = defaults }

function recipe.run(cfg)
  local spec = cfg.generate.gpt2 and gpt2 or tiny
  local data = tetra.train.data_source(cfg)
  tetra.ffi.C.tt_manual_seed(cfg.train.seed or 0)
  local model = spec.Model(cfg.model)
  local env = tetra.train.setup(cfg, model, data, { plan = spec.plan })
  local c, rows = env.mesh.coords, {}
  local g = cfg.generate
  local function ids_of(text)
    local t = {}
    for w in text:gmatch("%S+") do
      t[#t + 1] = assert(tonumber(w), "generate: not an id: " .. w)
    end
    return t
  end
  local function on_logits(row, V)
    local r = {}
    for i = 0, V - 1 do r[#r + 1] = string.format("%.9g", row[i]) end
    rows[#rows + 1] = table.concat(r, " ")
  end
  local prompt, ids = ids_of(g.prompt), nil
  if g.follow == "" then
    ids = env.generate(prompt, { max_new_tokens = g.tokens, temperature = 0,
                                 on_logits = on_logits })
  else
    local f = assert(io.open(g.follow))
    local follow = ids_of(f:read("*a"))
    f:close()
    assert(#follow >= g.tokens, "generate.follow: fewer ids than generate.tokens")
    ids = {}
    for i = 1, g.tokens do
      ids[i] = env.generate(prompt, { max_new_tokens = 1, temperature = 0,
                                      on_logits = on_logits })[1]
      prompt[#prompt + 1] = follow[i]
    end
  end
  print(string.format("generate rank %d ids %s", env.rank, table.concat(ids, " ")))
  -- The held-out loss of the same model (a pipeline's evaluation shares the last stage's)
  if g.eval then
    print(string.format("generate rank %d eval %.9g", env.rank, env.evaluate(2)))
  end
  if #rows > 0 and c.tp == 0 and c.dp == 0 and c.cp == 0 then
    local f = assert(io.open(g.out, "w"))
    f:write(table.concat(rows, "\n"), "\n")
    f:close()
  end
  return 0
end

return recipe
