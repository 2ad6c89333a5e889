-- tetra.repl: the interactive prompt (`tetra`, `tetra -i FILE`).
--
-- Lines are read with libedit (history in ~/.tetra_history, or $TETRA_HISTORY) when
-- stdin is a terminal, plainly otherwise, so sessions can be piped in. An expression is
-- printed without `print`; an incomplete statement continues on the next line; errors
-- print and the session goes on; each command reports how long it took.
--
-- `tetra -i FILE` runs FILE in the session's environment first. When FILE is a recipe
-- (a table with setup(cfg)) or a YAML config, the recipe's setup builds the model,
-- optimizer and data, and everything it returns is in scope: model, optimizer, data,
-- cfg, step() ... Helpers for a look inside a model:
--   inspect(x)        a tensor's shape and statistics, or a module's parameters with their
--                     norms, grad norms and (after probe) output activations
--   probe()           one forward + backward on a training batch, recording every
--                     module's output; leaves the gradients in place for inspect
--   train_steps(n)    n optimizer steps (default 1), printing loss and speed
--   help()            this list

local host = require("tetra.host")

local M = {}

-- -- Printing values -----------------------------------------------------------------

local function is_tensor(v)
  return type(v) == "cdata" and require("tetra.tensor").is_tensor(v)
end

local function pretty(v, depth, seen)
  depth, seen = depth or 0, seen or {}
  if type(v) == "string" then return depth == 0 and v or ("%q"):format(v) end
  if type(v) ~= "table" then return tostring(v) end
  local mt = getmetatable(v)
  if mt and mt.__tostring then return tostring(v) end
  if seen[v] or depth >= 2 then return tostring(v) end
  seen[v] = true
  local parts, n = {}, 0
  for i, x in ipairs(v) do
    n = i
    if i > 16 then parts[#parts + 1] = "... (" .. #v .. " items)"; break end
    parts[#parts + 1] = pretty(x, depth + 1, seen)
  end
  local keys = {}
  for k in pairs(v) do
    if not (type(k) == "number" and k >= 1 and k <= n and k % 1 == 0) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for i, k in ipairs(keys) do
    if i > 24 then parts[#parts + 1] = "... (" .. #keys .. " keys)"; break end
    local name = type(k) == "string" and k:match("^[%a_][%w_]*$") and k or ("[" .. pretty(k, 2) .. "]")
    parts[#parts + 1] = name .. " = " .. pretty(v[k], depth + 1, seen)
  end
  local indent = ("  "):rep(depth)
  local one_line = "{" .. table.concat(parts, ", ") .. "}"
  if #one_line <= 100 then return one_line end
  return "{\n" .. indent .. "  " .. table.concat(parts, ",\n" .. indent .. "  ") .. "\n" .. indent .. "}"
end
M.pretty = pretty

-- -- Inspection helpers --------------------------------------------------------------

local function tensor_stats(t)
  local tetra = require("tetra")
  return tetra.no_grad(function()
    local f = t.dtype == "f32" and t or t:float()
    local n = f:numel()
    local mean = f:mean():item()
    local sq = (f * f):sum():item()
    local var = n > 0 and math.max(sq / n - mean * mean, 0) or 0
    local mx = f:max():item()
    local mn = -((-f):max():item())
    return { shape = t:shape(), dtype = t.dtype, norm = math.sqrt(sq), mean = mean,
             std = math.sqrt(var), min = mn, max = mx }
  end)
end

local function shape_str(s) return "[" .. table.concat(s, ", ") .. "]" end

local function stats_line(st)
  return ("%-16s %s  norm %.4g  mean %.4g  std %.4g  min %.4g  max %.4g"):format(
    shape_str(st.shape), st.dtype, st.norm, st.mean, st.std, st.min, st.max)
end

local function module_name(model, mod)
  if not (model and model.named_modules) then return nil end
  for _, nm in ipairs(model:named_modules()) do
    if nm[2] == mod then return nm[1] end
  end
end

local function make_helpers(env)
  local activations = setmetatable({}, { __mode = "k" })

  function env.help()
    print([[
inspect(x)       a tensor's statistics, or a module's parameters (norm, grad norm) and,
                 after probe(), its output activation
probe()          one forward + backward on a training batch; records every module's
                 output and leaves the gradients in place
train_steps(n)   run n optimizer steps (default 1) and print loss, lr, tokens/s
model, optimizer, data, cfg, step()   set up by `tetra -i FILE` when FILE is a recipe
exit()           leave (or Ctrl-D)]])
  end

  function env.inspect(x)
    if is_tensor(x) then
      print(stats_line(tensor_stats(x)))
      local g = x.grad
      if g then print("grad " .. stats_line(tensor_stats(g))) end
      return
    end
    if type(x) == "table" and x.named_parameters then
      local name = module_name(env.model, x)
      print((name and name ~= "" and (name .. ": ") or "") .. tostring(x))
      local act = activations[x]
      if act then print("  output   " .. stats_line(act)) end
      for _, np in ipairs(x:named_parameters()) do
        local st = tensor_stats(np[2])
        local g = np[2].grad
        print(("  %-28s %-16s norm %.4g  grad norm %s"):format(np[1], shape_str(st.shape), st.norm,
          g and ("%.4g"):format(tensor_stats(g).norm) or "-"))
      end
      return
    end
    print(pretty(x))
  end

  function env.probe()
    local model, data, cfg = env.model, env.data, env.cfg
    if not (model and data and cfg) then
      error("probe() needs model, data and cfg in scope (start with tetra -i RECIPE)", 2)
    end
    local tetra = require("tetra")
    local handles = {}
    for _, nm in ipairs(model:named_modules()) do
      local mod = nm[2]
      handles[#handles + 1] = mod:register_forward_hook(function(_, out)
        if is_tensor(out) then activations[mod] = tensor_stats(out) end
      end)
    end
    model:zero_grad()
    local micro = cfg.train.micro_batch_size or cfg.train.batch_size
    local ok, err = pcall(function()
      local batch = data:batch(1, micro, cfg.model.seq_len, "train")
      local loss = tetra.train.loss(model, batch)
      local value = loss:item()
      loss:backward()
      print(("loss %.4f on %d x %d tokens; gradients kept, activations recorded"):format(
        value, micro, cfg.model.seq_len))
    end)
    for _, h in ipairs(handles) do h.remove() end
    if not ok then error(err, 0) end
  end

  function env.train_steps(n)
    if not env.step then error("train_steps() needs step() in scope (start with tetra -i RECIPE)", 2) end
    -- probe() leaves gradients behind; a step must start from zero.
    if env.model and env.model.zero_grad then env.model:zero_grad() end
    for _ = 1, n or 1 do
      local r = env.step()
      if type(r) == "table" then
        print(("step %d  loss %.4f  lr %.3g  grad norm %.3g  %.0f tok/s"):format(
          r.step or 0, r.loss or 0, r.lr or 0, r.grad_norm or 0, r.tokens_per_s or 0))
      end
    end
  end
end

-- -- Loading FILE into the session ---------------------------------------------------

-- Runs FILE with env as its globals; a recipe's setup(cfg) results join env.
function M.load_into(env, file, sets)
  local config = require("tetra.config")
  local recipe, cfg
  if file:match("%.ya?ml$") then
    recipe, cfg = config.load(file, sets)
  else
    local chunk, err = loadfile(file)
    if not chunk then error(err, 0) end
    setfenv(chunk, env)
    recipe = chunk()
    if type(recipe) == "table" and recipe.setup then
      cfg = config.build({ defaults = recipe.defaults, sets = sets })
    else
      recipe = nil
    end
  end
  if not recipe then return end
  env.recipe, env.cfg = recipe, cfg
  if recipe.setup then
    local built = recipe.setup(cfg)
    if type(built) == "table" then
      for k, v in pairs(built) do env[k] = v end
      env.env = built
    end
  end
end

-- -- The loop ------------------------------------------------------------------------

local function history_path()
  local p = os.getenv("TETRA_HISTORY")
  if p then return p ~= "" and p or nil end
  local home = os.getenv("HOME")
  return home and (home .. "/.tetra_history") or nil
end

-- Compiles a (possibly partial) chunk: returns fn, or nil + "incomplete", or nil + message.
local function compile(buf, env)
  local fn = loadstring("return " .. buf, "=stdin")
  if not fn then
    local err
    fn, err = loadstring(buf, "=stdin")
    if not fn then
      if err:match("<eof>.?$") then return nil, "incomplete" end
      return nil, err
    end
  end
  setfenv(fn, env)
  return fn
end

-- Keeps the traceback up to the user's own chunk.
local function on_error(err)
  local msg = type(err) == "table" and err.message or tostring(err)
  local tb = debug.traceback("", 2)
  local lines = {}
  for line in tb:gmatch("[^\n]+") do
    if line:find("tetra/repl.lua", 1, true) or line:find("in function 'xpcall'", 1, true) then break end
    if line:find("[builtin#", 1, true) or line:find("[C]:", 1, true) then line = nil end
    if line and not line:match("^stack traceback:") then lines[#lines + 1] = line end
  end
  if #lines > 0 and not (type(err) == "table" and err.user) then
    msg = msg .. "\nstack traceback:\n" .. table.concat(lines, "\n")
  end
  return msg
end

local function format_time(s)
  if s < 1e-3 then return ("%.0f us"):format(s * 1e6) end
  if s < 1 then return ("%.1f ms"):format(s * 1e3) end
  return ("%.2f s"):format(s)
end

-- Runs one complete chunk and prints its results and time.
local function execute(fn, out)
  local t0 = host.now()
  local res = { xpcall(fn, on_error) }
  local dt = host.now() - t0
  if not res[1] then
    out:write("error: ", tostring(res[2]), "\n")
  else
    local n = table.maxn(res)
    if n > 1 then
      local parts = {}
      for i = 2, n do parts[#parts + 1] = pretty(res[i]) end
      out:write(table.concat(parts, "\t"), "\n")
    end
  end
  out:write("(", format_time(dt), ")\n")
  out:flush()
end

function M.new_env()
  local env = setmetatable({}, { __index = _G })
  env.tetra = require("tetra")
  make_helpers(env)
  return env
end

-- Reads and runs commands until end of input or exit(). Returns the exit code.
function M.loop(env)
  local out = io.stdout
  local tty = host.isatty(0)
  local hist = tty and host.have_libedit and history_path()
  if hist then host.history(hist, "load") end
  local done = false
  env.exit = function() done = true end
  env.quit = env.exit
  if tty then
    out:write(("tetra %s -- Lua with tensors. help() lists the helpers; Ctrl-D leaves.\n"):format(host.version))
  end
  local buf = nil
  while not done do
    local line = host.readline(buf and ">> " or "tetra> ")
    if not line then break end
    if buf then buf = buf .. "\n" .. line else buf = line end
    if buf:match("^%s*$") then
      buf = nil
    else
      local fn, err = compile(buf, env)
      if fn then
        if hist then host.add_history(buf) end
        buf = nil
        execute(fn, out)
      elseif err ~= "incomplete" then
        if hist then host.add_history(buf) end
        buf = nil
        out:write("error: ", err, "\n")
        out:flush()
      end
    end
  end
  if buf then out:write("error: incomplete statement at end of input\n") end
  if hist then host.history(hist, "save") end
  if tty then out:write("\n") end
  return 0
end

-- `tetra` / `tetra -i FILE [--set k=v]...`
function M.main(file, sets)
  local env = M.new_env()
  if file then
    local ok, err = xpcall(M.load_into, on_error, env, file, sets)
    if not ok then
      io.stderr:write("tetra: ", tostring(err), "\n")
      return 1
    end
  end
  return M.loop(env)
end

return M
