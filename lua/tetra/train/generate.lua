-- tetra.train.generate: text from a trained model (no KV cache: models here are small).
local ffi = require("ffi")
local C = require("tetra.ffi").C
local F = require("tetra.nn.functional")
local to_dev = require("tetra.tensor").moved

local generate = {}

local free = F.free

-- Index of one token drawn from logits[0 .. V-1] (a float pointer): temperature 0 is
-- greedy; otherwise softmax(logits / temperature) over the top_k largest (all if nil).
local function sample(logits, V, temperature, top_k)
  local best = 0
  for i = 1, V - 1 do if logits[i] > logits[best] then best = i end end
  if not temperature or temperature <= 0 then return best end
  local idx = {}
  for i = 0, V - 1 do idx[i + 1] = i end
  if top_k and top_k > 0 and top_k < V then
    table.sort(idx, function(a, b) return logits[a] > logits[b] end)
    for i = #idx, top_k + 1, -1 do idx[i] = nil end
  end
  local weights, total = {}, 0.0
  for i, id in ipairs(idx) do
    weights[i] = math.exp((logits[id] - logits[best]) / temperature)
    total = total + weights[i]
  end
  local r = math.random() * total
  for i, id in ipairs(idx) do
    r = r - weights[i]
    if r <= 0 then return id end
  end
  return idx[#idx]
end

local function gcd(a, b) while b ~= 0 do a, b = b, a % b end return a end
local function lcm(a, b) return a / gcd(a, b) * b end

-- The rows a forward of cfg's model must come in multiples of (tetra.parallel.layout's
-- rule): a generation window is padded to it.
generate.row_multiple = require("tetra.parallel.layout").row_multiple

-- Continues prompt_ids (array of token ids) by opts.max_new_tokens (64) tokens, feeding
-- the last opts.seq_len tokens each time (no KV cache: models here are small).
-- opts: temperature (0.8), top_k (40), seed (0), seq_len, par (the model's applied
-- parallelism: a tensor-parallel head's logits are gathered), pipe (the pipeline runner
-- under pipeline parallelism: every stage runs its layers, the last samples and the
-- others receive the token), on_logits(row, V) (called with the float pointer to the
-- last position's V logits before each draw, where it is drawn), row_multiple (the
-- window is padded to a multiple of it: generate.row_multiple). Every rank of a
-- tensor-parallel group or a pipeline calls it alike. Returns the new ids (array).
function generate.generate(model, prompt_ids, opts)
  opts = opts or {}
  local n_new = opts.max_new_tokens or 64
  local seq_len = assert(opts.seq_len, "generate: opts.seq_len is required")
  math.randomseed(opts.seed or 0)
  local first_param = model:parameters()[1]
  local dev = first_param and first_param._device or C.TT_CPU  -- the model's device
  local par, pipe = opts.par, opts.pipe
  -- The window is padded at its end, where no earlier position of a causal model sees
  -- it, to a multiple of what the layers need (generate.row_multiple) and of the tensor-
  -- parallel group's size under sequence parallelism, which cuts the sequence over it.
  local multiple = lcm(opts.row_multiple or 1, par and par.sequence and par.layout.tp or 1)
  -- The context, padded, stays within seq_len (learned positions end there): at most the
  -- largest multiple of `multiple` in it.
  local context = math.max(multiple, math.floor(seq_len / multiple) * multiple)
  local ids = {}
  for i, id in ipairs(prompt_ids) do ids[i] = id end
  local out = {}
  F.no_grad(function()
    for _ = 1, n_new do
      local first = math.max(1, #ids - context + 1)
      local T = #ids - first + 1
      -- The pipeline reads (b, T + 1) tokens, as in training (the last is not read).
      local width = math.ceil(T / multiple) * multiple + (pipe and 1 or 0)
      local x = F.empty({ 1, width }, C.TT_I64)
      local p = ffi.cast("int64_t *", C.tt_tensor_data(x))
      for j = 0, width - 1 do p[j] = j < T and ids[first + j] or 0 end
      x = to_dev(x, dev)
      local y, id
      if pipe then y = pipe:forward_logits(x) else y = model(x) end
      free(x)
      if y then
        if par then                                    -- tensor parallel: gathered
          local full = par:full_logits(y)
          if full ~= y then free(y) end
          y = full
        end
        local logits = to_dev(y, C.TT_CPU)             -- (1, width, V), contiguous
        if logits._dtype ~= C.TT_F32 then              -- a bf16 head's: widened
          local wide = logits:float()
          free(logits)
          logits = wide
        end
        local V = tonumber(logits._shape[2])
        local last = ffi.cast("float *", C.tt_tensor_data(logits)) + (T - 1) * V
        if opts.on_logits then opts.on_logits(last, V) end
        id = sample(last, V, opts.temperature or 0.8, opts.top_k or 40)
        free(logits)
      end
      if pipe then id = pipe:share_number(id or 0) end
      ids[#ids + 1] = id
      out[#out + 1] = id
    end
  end)
  return out
end

-- The text that continues `prompt` (a string) by n tokens of env's model, drawn with
-- train.temperature, top_k and seed (the run's samples; the REPL's sample()). Every rank
-- of a tensor-parallel or pipelined model calls it alike.
function generate.continuation(env, prompt, n)
  local t = env.cfg.train
  local ids = env.generate(env.tokenizer:encode(prompt), { max_new_tokens = n,
    temperature = t.temperature, top_k = t.top_k, seed = t.seed })
  return env.tokenizer:decode(ids), #ids
end

-- Prints a continuation of `prompt` (a string; default train.prompt or a newline) on
-- rank 0, using env.tokenizer (nothing to print without one) and train.sample_tokens,
-- temperature, top_k, seed.
-- A tensor-parallel or pipelined model generates on every rank (its forward is
-- collective: every data- and context-parallel replica runs its own, alike); rank 0
-- prints.
function generate.print_sample(env, prompt)
  local t = env.cfg.train
  if not env.tokenizer or (t.sample_tokens or 0) <= 0 then return end
  local par = env.par
  if env.rank ~= 0 and par.layout.tp == 1 and not par.stage then return end
  prompt = prompt or t.prompt or "\n"
  local text, n = generate.continuation(env, prompt, t.sample_tokens)
  if env.rank ~= 0 then return end
  io.stdout:write("--- sample (", n, " tokens, temperature ", tostring(t.temperature),
                  ", top-k ", tostring(t.top_k), ") ---\n", prompt, text, "\n---\n")
  io.stdout:flush()
end

return generate
