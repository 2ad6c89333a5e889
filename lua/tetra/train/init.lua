-- tetra.train: the training loop recipes share.
--
--   local env = train.setup(cfg, model, data, { plan = plan })  -- parallelism, precision,
--                                                               -- optimizer, metrics
--   train.run(env)                                              -- steps, eval, progress
--
-- The parts, one file each:
--   sources.lua   where tokens come from: mock data or tetra.data's pipeline (data_source)
--   device.lua    train.device, the parameters moved there, batches uploaded (pinned)
--   setup.lua     env: the layout, precision, optimizer, step strategy, guard, graphs
--   step.lua      one optimizer step, top to bottom (env.step), and evaluation
--   loop.lua      the loop: records, progress, eval, samples, checkpoints, roll-back
--   generate.lua  text from the model (samples)
-- The loss guard (tetra.train.guard, train.loss_guard) judges each step from the mean loss
-- and the gradient norm, agreed over every rank: a bad step skips the update, and
-- train.max_bad_steps of them in a row roll back to the latest checkpoint and skip their
-- data (train.roll_back); step s reads the global batch at data position
-- env.guard:position(s), which is s until a window was skipped.
--
-- The model is built whole on the CPU by the recipe (so a seed gives the same initial
-- weights on every rank and device), its randn weights lazy (tetra.h: each rank draws
-- only what it keeps); train.setup then applies the layout's parallelism
-- from the recipe's plan (tetra.parallel.apply), the precision (train.precision through
-- tetra.optim.amp) and moves the parameters to train.device (cpu, cuda, cuda:N); the
-- optimizer state is created beside them and each batch is moved as it is drawn.
local C = require("tetra.ffi").C
local F = require("tetra.nn.functional")
local checkpoint = require("tetra.checkpoint")
local sources = require("tetra.train.sources")
local device = require("tetra.train.device")
local step = require("tetra.train.step")
local loop = require("tetra.train.loop")
local generate = require("tetra.train.generate")
local user_error = require("tetra.util.errors").raise
local config_error = require("tetra.config.registry").error
local models = require("tetra.models")

local train = {}

-- -- Data (tetra.train.sources) --------------------------------------------------------

train.mock_data = sources.mock_data
train.mix_seed = sources.mix_seed
train.data_source = sources.data_source

-- tokens (b, T + 1) -> inputs (b, T), targets (b, T), both contiguous.
train.inputs_targets = F.inputs_targets
train.loss = step.loss

-- -- Device (tetra.train.device) -------------------------------------------------------

train.device = device.id
train.to_device = device.move_model

-- -- Setup, the loop, generation -------------------------------------------------------

-- Builds the training environment: env.model, env.optimizer, env.data, env.cfg, env.mesh,
-- env.ddp, env.schedule, env.amp (the tetra.amp context of train.precision), env.device
-- (the engine device id of train.device), env.step() (one optimizer step, returns its
-- metrics record), env.evaluate([n_batches]) and env.generate(prompt_ids, opts).
-- The model (built whole, on the CPU) is split for the layout, wrapped for the precision
-- and moved to train.device here; env.par is tetra.parallel.apply's result.
-- opts: plan (the model's parallel plan, recipes/NAME/plan.lua; needed for tensor, context or
-- pipeline parallelism), tokenizer (tok:encode(text), tok:decode(ids); for samples),
-- on_grads(env, step) (see env.step; eager steps only: a replayed step runs no Lua),
-- graph_check (train.cuda_graphs' steps on the CPU in tetra.train.graph's check mode, for tests).
-- Metrics record of a step: step, loss, lr, grad_norm (before clipping; nil on a skipped
-- step), tokens, tokens_per_s, step_time_s, data_wait_s, exposed_comm_s (seconds blocked
-- on communication: what computation did not hide, pipeline bubbles included),
-- loss_scale (the fp16 scale after this step's update; 1 in other precisions), skipped
-- (true when inf/NaN grads skipped the optimizer step); this rank's param_bytes,
-- grad_bytes, optimizer_bytes, peak_bytes (the allocator's high-water mark during the
-- step) and step_peak_bytes (how far the step rose above what it started with:
-- activations, gradients, communication buffers), live_bytes and cached_bytes (after the
-- optimizer update). The step's time by phase, which add up to step_time_s: data_wait_s,
-- forward_s and backward_s (computing, waits left out), exposed_comm_s, optimizer_s
-- (clipping, the update, zeroing; waits left out), other_s; a step replayed from a CUDA
-- graph (train.cuda_graphs) has graph_s instead (forward, backward and the update in one
-- timing; forward_s, backward_s and optimizer_s are 0). mfu (0-1) when the device's
-- peak is known (tetra.obs.mfu; train.peak_tflops). train.run adds checkpoint_s (the loop's
-- time on checkpoints since the previous record) and eval_loss.
train.setup = require("tetra.train.setup")

train.run = loop.run
train.roll_back = loop.roll_back
train.records_kept = loop.records_kept
train.generate = generate.generate
train.print_sample = generate.print_sample

-- -- Recipes -----------------------------------------------------------------------------

-- The recipe table for a model class (see recipes/llama.lua): setup(cfg) builds the data
-- source, seeds the RNG (so the initial weights depend on the seed only), builds
-- spec.Model(cfg.model) whole and the training state, which applies spec.plan (the
-- model's parallel plan, recipes/NAME/plan.lua) for the layout; run(cfg) reports the model's
-- size and this rank's memory on rank 0 and trains. setup(cfg, extra): extra's fields
-- join train.setup's opts (tests: graph_check, on_grads).
function train.recipe(spec)
  local recipe = { name = spec.name, Model = spec.Model, plan = spec.plan,
                   defaults = spec.defaults }
  function recipe.setup(cfg, extra)
    -- A recipe builds its own family's model: model.family naming another (or a model
    -- read from model.init_from being another) would build this one under the other's
    -- rules (its MLP width, tied embeddings, tensor names).
    local source = cfg.model.init_from
    local family = models.family_of(spec.Model)
    if family and cfg.model.family and family ~= cfg.model.family then
      if source then
        user_error(string.format("model.init_from=%s holds a %s model but recipe %s builds " ..
          "a %s: run recipes/%s/model.lua", source, cfg.model.family, spec.name, family,
          cfg.model.family))
      end
      config_error("model.family is %s but recipe %s builds a %s model: drop model.family, " ..
                   "or run recipes/%s/model.lua (in a YAML config: train.recipe=%s)",
                   cfg.model.family, tostring(spec.name), family, cfg.model.family,
                   cfg.model.family)
    end
    local data, tokenizer = train.data_source(cfg)
    checkpoint.precheck(cfg)   -- a missing or corrupt checkpoint: before the model
    C.tt_manual_seed(cfg.train.seed or 0)
    local hf = source and require("tetra.checkpoint.hf")
    -- A Tetra checkpoint, or a Hugging Face folder (Llama, Qwen2, GPT-2: its tensors are
    -- Tetra's under other names, some transposed or side by side), is read once the
    -- model is split, each rank reading its own part (checked first: a missing or bad one
    -- stops before the model is built).
    local from_hf = source and source:match("^hf:")
    local index, dir
    if from_hf then index, dir = hf.sliced_index(source) end
    if source and not from_hf then checkpoint.open_weights(source).close() end
    local model = spec.Model(cfg.model)
    local opts = { tokenizer = tokenizer, plan = spec.plan }
    if from_hf then
      opts.init_from, opts.init_index = dir, index
    elseif source then
      opts.init_from = source
    end
    for k, v in pairs(extra or {}) do opts[k] = v end
    return train.setup(cfg, model, data, opts)
  end
  -- The start-up line's words on master weights kept on the host (AdamW:masters_on_host):
  -- under ZeRO-1 and 2 the host keeps this rank's shares, the device drops whole weights.
  local function masters_line(mem)
    local host, off = mem.host_masters or 0, mem.released_masters or 0
    if off == 0 then return "" end
    if host == off then
      return string.format("; and %.2f MB of f32 master weights, off the device through " ..
                           "forward and backward", host / 1e6)
    end
    return string.format("; and %.2f MB of f32 master weights (this rank's shares), %.2f MB " ..
                         "of weights off the device through forward and backward",
                         host / 1e6, off / 1e6)
  end
  function recipe.run(cfg)
    local env = recipe.setup(cfg)
    if env.rank == 0 then
      local m, mem = cfg.model, env.memory
      local split = env.mesh.size > 1 and " on this rank" or ""
      print(string.format("%s: %.2fM parameters%s, %d layers, dim %d, seq %d, batch %d",
        spec.name, env.model:num_params() / 1e6, split, m.n_layers, m.dim, m.seq_len,
        cfg.train.batch_size))
      print(string.format("memory%s: parameters %.2f MB, gradients %.2f MB, optimizer " ..
        "state %.2f MB%s", split, mem.params / 1e6, mem.grads / 1e6, mem.optimizer / 1e6,
        mem.host_optimizer and string.format(" (offloaded: %.2f MB in host memory%s)",
          mem.host_optimizer / 1e6, masters_line(mem)) or ""))
      if env.optimizer._overlap then
        print("offload: each update runs on the host while the next step's forward runs, " ..
              "its weights landing block by block")
      end
      local d = cfg.data or {}
      local function paths(p) return type(p) == "table" and table.concat(p, ",") or tostring(p) end
      local blend = {}
      for _, ds in ipairs(d.input_path and {} or d.datasets or {}) do
        blend[#blend + 1] = ("%s (weight %g)"):format(paths(ds.path or ds.input_path), ds.weight or 1)
      end
      print(d.mock and "data: mock tokens (uniform random; data.mock=true), not text" or
            "data: " .. (d.input_path and paths(d.input_path) or table.concat(blend, ", ")))
      local held = (cfg.train.eval_every or 0) > 0 and require("tetra.data").holdout(cfg)
      if held then
        print(string.format("eval: the last %g%% of each training source, held out " ..
                            "(data.eval_fraction; data.eval_path names other data)", held * 100))
      end
    end
    local out = train.run(env)
    -- Stopped at SIGUSR1 (tetra.train.loop), on every rank alike: a status of its own,
    -- so that a supervisor tells it from the end of training and from a failure.
    if out.stopped then
      C.tt_dist_set_agreed_exit(loop.STOPPED_EXIT)
      return loop.STOPPED_EXIT
    end
    return out
  end
  return recipe
end

return train
