-- Mutation fuzzing of the text formats a user or a crash can hand us: the YAML config
-- path (libyaml through host.parse_yaml, then tetra.config's checks) and a checkpoint's
-- index.json / state.json (tetra.util.json's reader, then tetra.checkpoint's load). Each input is a
-- valid document with random bytes replaced, inserted or deleted; the outcome must be a
-- value or one user-facing error (a config or checkpoint message), never a Lua runtime
-- error or a crash. Hugging Face folders (config.json, model.safetensors.index.json)
-- go through tetra.checkpoint.hf the same way. Deterministic: a fixed seed, 1500 inputs per format (a documented
-- longer run: TETRA_FUZZ_N=100000 tetra test tests/lua/fuzz_spec.lua).
local tetra = require("tetra")
local config = require("tetra.config")
local checkpoint = require("tetra.checkpoint")
local json = require("tetra.util.json")
local host = require("tetra.host")

local N = tonumber(os.getenv("TETRA_FUZZ_N") or "") or 1500
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")

local seed = 12345
local function rand(n)   -- deterministic LCG, 1..n
  seed = (seed * 1103515245 + 12345) % 2147483648
  return seed % n + 1
end

local BYTES = { ":", " ", "\n", "-", "[", "]", "{", "}", '"', "'", ",", "0", "9", "e", "\0",
                "\255", "#", "&", "*", "!", "|", ">", "\t", "\\", "1e999", "null", "true" }
local function mutate(s)
  for _ = 1, rand(4) do
    local at = rand(#s + 1) - 1
    local r = rand(3)
    local piece = BYTES[rand(#BYTES)]
    if r == 1 then s = s:sub(1, at) .. piece .. s:sub(at + 2)
    elseif r == 2 then s = s:sub(1, at) .. piece .. s:sub(at + 1)
    else s = s:sub(1, at) .. s:sub(at + 1 + rand(8)) end
  end
  return s
end

local function user_error(e)
  return config.is_error(e) or (type(e) == "table" and e.user) or
         (type(e) == "string" and e:match("^offset %d+: "))
end

describe("fuzz", function()
  it("YAML configs: a config or one config error, never a runtime error", function()
    local f = assert(io.open(here .. "/../../recipes/configs/llama-7b.yaml"))
    local text = f:read("*a")
    f:close()
    local bad = {}
    for i = 1, N do
      local doc = mutate(text)
      local ok, err = pcall(function()
        local yaml, perr = host.parse_yaml(doc)
        if perr then config.error("%s", perr) end
        if type(yaml) ~= "table" then config.error("not a mapping") end
        return config.build({ defaults = tiny.defaults, yaml = yaml, world_size = false })
      end)
      if not ok and not user_error(err) then bad[#bad + 1] = i .. ": " .. tostring(err) end
    end
    expect(bad).to_equal({})
  end)

  it("checkpoint JSON: a value or one error naming the offset, and load fails cleanly", function()
    local dir = os.tmpname()
    os.remove(dir)
    local env = tiny.setup(config.build({ defaults = tiny.defaults, world_size = false,
      sets = { "checkpoint.dir=" .. dir, "parallel.tensor_parallel_size=1", "log.progress=false" } }))
    local ck = checkpoint.save(env)
    local state = assert(io.open(ck .. "/state.json")):read("*a")
    os.remove(ck .. "/checksums.json")   -- what is fuzzed is the parsing, not the CRC
    local bad = {}
    for i = 1, N do
      local doc = mutate(state)
      local ok, err = pcall(json.decode, doc)
      if not ok and not user_error(err) then bad[#bad + 1] = "decode " .. i .. ": " .. tostring(err) end
      if i % 10 == 0 then   -- the whole load path, on a tenth of them
        local f = assert(io.open(ck .. "/state.json", "w")); f:write(doc); f:close()
        local lok, lerr = pcall(checkpoint.load, env, ck)
        if not lok and not user_error(lerr) then bad[#bad + 1] = "load " .. i .. ": " .. tostring(lerr) end
      end
    end
    -- index.json (written by split layouts): here one listing every tensor whole, in the
    -- files rank 0 wrote, then fuzzed through the whole load.
    local f = assert(io.open(ck .. "/state.json", "w")); f:write(state); f:close()
    local tensors = {}
    for _, file in ipairs({ "model.safetensors", "optim.safetensors" }) do
      local st = require("tetra.io").open(ck .. "/" .. file)
      for _, name in ipairs(st:names()) do
        local shape = st:info(name).shape
        tensors[name] = { shape = shape, shards = { { file = file, dim = 0, offset = 0,
                                                      length = shape[1] } } }
      end
      st:close()
    end
    local index = json.encode({ format = 1, tensors = tensors })
    f = assert(io.open(ck .. "/index.json", "w")); f:write(index); f:close()
    expect(checkpoint.load(env, ck)).to_be(ck)   -- the unfuzzed index loads
    for i = 1, N / 10 do
      f = assert(io.open(ck .. "/index.json", "w")); f:write(mutate(index)); f:close()
      local lok, lerr = pcall(checkpoint.load, env, ck)
      if not lok and not user_error(lerr) then bad[#bad + 1] = "index " .. i .. ": " .. tostring(lerr) end
    end
    os.execute("rm -rf '" .. dir .. "'")
    expect(bad).to_equal({})
  end)

  it("Hugging Face folders: config.json and the shard index, one error or a model", function()
    local hf = require("tetra.checkpoint.hf")
    local dir = os.tmpname()
    os.remove(dir)
    local env = tiny.setup(config.build({ defaults = tiny.defaults, world_size = false,
      sets = { "checkpoint.dir=" .. dir .. "/ck", "log.progress=false" } }))
    local ck = checkpoint.save(env)
    expect(hf.export(ck, dir .. "/hf", { max_shard_size = 20000 }) > 1).to_be(true)
    local function read(name) return assert(io.open(dir .. "/hf/" .. name)):read("*a") end
    local function write(name, text)
      local f = assert(io.open(dir .. "/hf/" .. name, "w")); f:write(text); f:close()
    end
    local cfg_text, index = read("config.json"), read("model.safetensors.index.json")
    expect(hf.model_config("hf:" .. dir .. "/hf").dim).to_be(64)
    local bad = {}
    for i = 1, N do
      local which = i % 2 == 0 and "config.json" or "model.safetensors.index.json"
      write("config.json", cfg_text)
      write("model.safetensors.index.json", index)
      write(which, mutate(which == "config.json" and cfg_text or index))
      local ok, err = pcall(hf.model_config, "hf:" .. dir .. "/hf")
      if not ok and not user_error(err) then bad[#bad + 1] = which .. " " .. i .. ": " .. tostring(err) end
      if i % 10 == 0 then   -- the whole conversion, on a tenth of them
        os.execute("rm -rf '" .. dir .. "/out'")
        local cok, cerr = pcall(hf.import, dir .. "/hf", dir .. "/out")
        if not cok and not user_error(cerr) then bad[#bad + 1] = "import " .. i .. ": " .. tostring(cerr) end
      end
    end
    os.execute("rm -rf '" .. dir .. "'")
    expect(bad).to_equal({})
  end)
end)
