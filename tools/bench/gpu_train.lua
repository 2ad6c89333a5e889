-- tools/bench/gpu_train.lua — the Llama recipe's model trained by tetra.train on one
-- device (train.device: cpu, cuda or cuda:N) at a given train.precision: the GPU end-to-end
-- test (tests/cuda/gpu_bf16.sh: the bf16 GPU loss curve against the fp32 CPU one) and the
-- tokens/s figure of tools/gpu-check come from here.
--
--   tetra run tools/bench/gpu_train.lua --set train.device=cuda --set train.precision=bf16 \
--     --set log.metrics_file=gpu.jsonl
--
-- Everything is train.setup's: the weights are initialised on the CPU from train.seed (so
-- every device starts from the same values) and moved, the optimizer state is created on
-- the device, each batch (train.data_source: mock tokens, or the text of
-- data.input_path through tetra.data's pipeline) is moved as it is drawn. The metrics file
-- (log.metrics_file) holds one JSON line per step written here as
-- `"key": value` pairs (step, loss, lr, grad_norm, tokens, tokens_per_s, step_time_s,
-- loss_scale, skipped, step_peak_bytes), which tests/cuda/gpu_bf16.sh and gpu_recompute.sh parse. The last two lines printed:
-- "gpu_train: loss A -> B, nonfinite=N of S steps" (tools/gpu-check fails a stage with a
-- NaN or infinite loss) and "gpu_train: ... tokens_per_s=N" over the steps from
-- train.timed_from on (the first ones pay for allocation and cuBLASLt's heuristics).
local tetra = require("tetra")
io.stdout:setvbuf("line")   -- a run stopped at its time cap keeps its lines
local train = tetra.train

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local llama = dofile(here .. "/../../recipes/llama.lua")

local recipe = {
  name = "gpu_train",
  defaults = {
    model = { vocab_size = 256, dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2,
              ffn_hidden = 128, seq_len = 32, norm_eps = 1e-5, rope_theta = 10000.0,
              tie_embeddings = false, init_std = 0.02 },
    train = { steps = 20, batch_size = 8, lr = 3e-3, min_lr = 3e-4, warmup_steps = 2,
              lr_schedule = "cosine", weight_decay = 0.1, max_grad_norm = 1.0, seed = 0,
              device = "cpu", timed_from = 3, sample_tokens = 0 },
    optim = { name = "adamw", beta1 = 0.9, beta2 = 0.95, eps = 1e-8 },
    data = { mock = true },
  },
}

local FIELDS = { "step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "step_time_s",
                 "loss_scale", "skipped", "step_peak_bytes" }

local function line(r)
  local parts = {}
  for _, k in ipairs(FIELDS) do
    local v = r[k]
    if type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge then
      v = string.format("%.9g", v)
    elseif type(v) ~= "boolean" then
      v = "null"
    end
    parts[#parts + 1] = string.format('"%s": %s', k, tostring(v))
  end
  return "{" .. table.concat(parts, ", ") .. "}\n"
end

function recipe.run(cfg)
  local t = cfg.train
  local env = llama.setup(cfg)
  local tokens_per_step = t.batch_size * cfg.model.seq_len
  print(string.format("gpu_train: %.2fM parameters on %s, precision %s, %d tokens/step",
                      env.model:num_params() / 1e6, t.device, env.amp.precision,
                      tokens_per_step))
  local out = cfg.log and cfg.log.metrics_file
  local f = out and out ~= "" and assert(io.open(out, "w")) or nil
  local timed_t, timed_steps = 0.0, 0
  local first_loss, last_loss, nonfinite = nil, nil, 0
  for step = 1, t.steps do
    local r = env.step()
    local l = r.loss
    if type(l) ~= "number" or l ~= l or l == math.huge or l == -math.huge then
      nonfinite = nonfinite + 1
    else
      first_loss, last_loss = first_loss or l, l
    end
    if step >= t.timed_from then
      timed_t, timed_steps = timed_t + r.step_time_s, timed_steps + 1
    end
    if f then f:write(line(r)); f:flush() end
  end
  if f then f:close() end
  -- train.sample_tokens > 0 with a tokenizer (data.mock=false): the run's sample, as a
  -- training run prints it at its end (tests/cuda/gpu_fp8.sh reads it)
  train.print_sample(env)
  local tps = timed_steps > 0 and tokens_per_step * timed_steps / timed_t or 0
  print(string.format("gpu_train: loss %.4f -> %.4f, nonfinite=%d of %d steps",
                      first_loss or 0 / 0, last_loss or 0 / 0, nonfinite, t.steps))
  print(string.format("gpu_train: %d steps, %s, %s: tokens_per_s=%.1f", t.steps, t.device,
                      env.amp.precision, tps))
end

return recipe
