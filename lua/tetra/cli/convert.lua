-- `tetra convert`: Hugging Face model folders <-> Tetra checkpoints (tetra.checkpoint.hf).
--
--   tetra convert --to hf CHECKPOINT OUT_DIR [--max-shard-size 5GB] [--rope-layout hf|meta]
--   tetra convert --from hf HF_DIR OUT_CHECKPOINT [--rope-layout hf|meta]
local M = {}

local USAGE = [[
usage: tetra convert --to hf CHECKPOINT OUT_DIR [--max-shard-size SIZE] [--rope-layout hf|meta]
       tetra convert --from hf HF_DIR OUT_CHECKPOINT [--rope-layout hf|meta]

  --to hf            a Tetra checkpoint (step_NNNNNN/, or a checkpoint.dir: its latest) to a
                     Hugging Face folder: config.json + model.safetensors, or
                     model-0000K-of-0000N.safetensors + model.safetensors.index.json
  --from hf          a Hugging Face Llama (LlamaForCausalLM) or GPT-2 (GPT2LMHeadModel)
                     folder to a weights-only checkpoint: train from it with
                     --set model.init_from=OUT_CHECKPOINT (or skip it: model.init_from=hf:HF_DIR)
  --max-shard-size   largest safetensors file written (5GB, 200MB, 2GiB, bytes); default 5GB
  --rope-layout      hf (default): q/k projections in rotate-half order, as transformers
                     computes; meta: the Hugging Face files hold them in Meta's interleaved
                     order (weights copied from Meta's checkpoints without permuting)
]]

local usage = require("tetra.util.errors").usage("tetra convert", "tetra convert --help")

function M.main(...)
  local args = { ... }
  local direction, opts, paths = nil, {}, {}
  local i = 1
  while i <= #args do
    local a = args[i]
    local function value()
      i = i + 1
      if args[i] == nil then return nil end
      return args[i]
    end
    if a == "--help" or a == "-h" then
      io.stdout:write(USAGE)
      return 0
    elseif a == "--to" or a == "--from" then
      local v = value()
      if v ~= "hf" then return usage("%s takes hf, got %s", a, tostring(v)) end
      if direction then return usage("give one of --to hf and --from hf") end
      direction = a:sub(3)
    elseif a == "--max-shard-size" then
      local v = value()
      if not v then return usage("--max-shard-size needs a size (e.g. 5GB)") end
      local ok, n = pcall(require("tetra.checkpoint.hf").parse_size, v)
      if not ok then return usage("%s", n.message or tostring(n)) end
      opts.max_shard_size = n
    elseif a == "--rope-layout" then
      local v = value()
      if v ~= "hf" and v ~= "meta" then return usage("--rope-layout takes hf or meta, got %s", tostring(v)) end
      opts.rope_layout = v
    elseif a:sub(1, 1) == "-" and a ~= "-" then
      return usage("unknown option '%s'", a)
    else
      paths[#paths + 1] = #a > 1 and a:gsub("/+$", "") or a   -- out/ names out
    end
    i = i + 1
  end
  if not direction then return usage("say --to hf or --from hf") end
  if #paths ~= 2 then return usage("expected a source and an output directory, got %d path(s)", #paths) end
  if direction == "from" and opts.max_shard_size then
    return usage("--max-shard-size applies to --to hf only")
  end
  local hf = require("tetra.checkpoint.hf")
  if direction == "to" then
    local n, family = hf.export(paths[1], paths[2], opts)
    print(string.format("wrote %s (%s, %d safetensors file%s)", paths[2], family, n, n == 1 and "" or "s"))
  else
    local family = hf.import(paths[1], paths[2], opts)
    print(string.format("wrote %s (%s, weights only: train from it with --set model.init_from=%s)",
                        paths[2], family, paths[2]))
  end
  return 0
end

return M
