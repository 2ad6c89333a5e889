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
--   full(t)           the whole parameter of which t is a tensor-parallel shard
--   interrupted()     whether Ctrl-C was pressed (a safe point for loops of one's own)
--   relayout{tp=2}    the same state re-sharded into another layout of the same ranks
--   help()            this list
--
-- Ctrl-C stops the running command and returns to the prompt with the session intact:
-- train_steps stops between two steps, step() after the step it is in; other Lua code
-- stops where it is. At the prompt Ctrl-C clears the line; Ctrl-D leaves. Tab completes
-- globals, fields after `.`, methods after `:` (tensors and modules too) and config keys.
--
-- Under mpirun (`mpirun -np N tetra -i RECIPE`) the session is SPMD: rank 0 takes the
-- terminal and reads lines; each line runs on every rank (or the ranks chosen with
-- `%on 1,3`, `%on tp=0`, `%on all`); what the ranks print and return comes back to rank
-- 0, identical answers once with their ranks (`[0-3] 2.3145`). Ctrl-C is agreed by all
-- the ranks running the line at their next safe point (between steps), so no rank is
-- left inside a collective.

local host = require("tetra.host")
local errors = require("tetra.util.errors")
local fs = require("tetra.util.fs")
local channel = require("tetra.repl.channel")
local layout = require("tetra.parallel.layout")

local M = {}

-- -- Printing values -----------------------------------------------------------------

local function is_tensor(v)
  return type(v) == "cdata" and require("tetra.tensor").is_tensor(v)
end

-- The placement of a tensor that is a model parameter (set by the session when a
-- recipe's parallelism gave its parameters placements), nil otherwise.
local placement_of = function() return nil end

local function shard_header(t)
  local pl = placement_of(t)
  if not (pl and pl.split) then return nil end
  local shape = "[" .. table.concat(pl.shape, ", ") .. "]"
  return ("shard of %s %s: dim %d, [%d, %d) of %d"):format(pl.name or "?", shape, pl.dim,
    pl.offset, pl.offset + pl.length, pl.shape[pl.dim + 1])
end

local function pretty(v, depth, seen)
  depth, seen = depth or 0, seen or {}
  if type(v) == "string" then return depth == 0 and v or ("%q"):format(v) end
  if depth == 0 and is_tensor(v) then
    local head = shard_header(v)
    if head then return head .. "\n" .. tostring(v) end
  end
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

-- -- Interrupts ------------------------------------------------------------------------

local spmd   -- the channel between the ranks when the session runs under mpirun
local live_status   -- f(text): rank 0's one-line progress on its terminal, under mpirun

-- Whether Ctrl-C asked the running command to stop (the request is consumed). Under
-- mpirun every rank running the command calls this at the same point and gets the same
-- answer, so they all stop after the same step.
local function interrupt_requested()
  if spmd then return spmd:agree_interrupt() end
  return host.interrupted(true)
end

-- Runs fn(...) with Ctrl-C only recorded, never raised inside it: a step stopped half-way
-- would leave gradients and the tape behind (and, under mpirun, ranks in a collective).
local lua_interruptible = false
local function set_lua_interruptible(on)
  lua_interruptible = on
  host.interrupt_lua(on)
end

local function uninterrupted(fn, ...)
  local was = lua_interruptible
  set_lua_interruptible(false)
  local res = { pcall(fn, ...) }
  set_lua_interruptible(was)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

-- The recipe's own step() for each session env; env.step is wrapped (see load_into).
local raw_steps = setmetatable({}, { __mode = "k" })

-- The placement of `t` when it is a parameter of the session's parallel model.
local function find_placement(env, t)
  local par = rawget(env, "par")
  if not (is_tensor(t) and type(par) == "table" and par.placements) then return nil end
  local T = require("tetra.tensor")
  local key = T.key(t)
  for _, e in ipairs(par:placements()) do
    if T.key(e.tensor) == key then return e.placement end
  end
end

local function make_helpers(env)
  local activations = setmetatable({}, { __mode = "k" })
  placement_of = function(t) return find_placement(env, t) end

  function env.help()
    print([[
inspect(x)       a tensor's statistics, or a module's parameters (norm, grad norm) and,
                 after probe(), its output activation
probe()          one forward + backward on a training batch; records every module's
                 output and leaves the gradients in place
train_steps(n)   run n optimizer steps (default 1) and print loss, lr, tokens/s;
                 Ctrl-C stops it between two steps
full(t)          the whole parameter of which t is a tensor-parallel shard (every
                 rank of t's tp group must run it)
interrupted()    whether Ctrl-C was pressed, for loops of your own (under mpirun
                 agreed by the ranks running the line: all of them must call it)
relayout{tp = 2, pp = 2}   the model and optimizer state re-sharded into a new layout
                 of the same ranks (every rank runs it); training goes on from there
%on 1,3 | %on tp=0 | %on all    (under mpirun) the ranks the next lines run on
model, optimizer, data, cfg, step()   set up by `tetra -i FILE` when FILE is a recipe
exit()           leave (or Ctrl-D)]])
  end

  function env.inspect(x)
    if is_tensor(x) then
      local head = shard_header(x)
      if head then print(head) end
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
    local ok, err = pcall(function()
      if env.par and env.ddp then
        -- A recipe's parallel model: its own step strategy runs forward and backward
        -- on this rank's part of one global batch (every rank must run probe()).
        local T = require("tetra.tensor")
        local strategy = require("tetra.parallel.step").new(env.par, env.ddp, env.amp, cfg)
        local global = T.moved(data:batch(1, cfg.train.batch_size, cfg.model.seq_len, "train"),
                               env.device)
        local mine = data.local_rows and global or env.ddp:batch_slice(global)
        env.ddp:begin_step()
        local sum = strategy:forward_backward(mine, 1)   -- a one-value tensor, or a number
        if type(sum) ~= "number" then sum = sum:item() end
        local value = env.mesh.dpcp:mean(sum)
        print(("loss %.4f on %d x %d tokens; gradients kept, activations recorded"):format(
          value, cfg.train.batch_size, cfg.model.seq_len))
        return
      end
      local micro = cfg.train.micro_batch_size or cfg.train.batch_size
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
    local step = raw_steps[env] or env.step
    if not step then
      error("train_steps() needs step() in scope (start with tetra -i RECIPE)", 2)
    end
    n = n or 1
    if type(n) ~= "number" or n < 1 or n % 1 ~= 0 then
      error("train_steps(n): n must be a positive whole number, got " .. tostring(n), 2)
    end
    -- The whole loop runs with Ctrl-C only recorded: it is honoured between two steps.
    uninterrupted(function()
      -- probe() leaves gradients behind; a step must start from zero.
      if env.model and env.model.zero_grad then env.model:zero_grad() end
      for i = 1, n do
        local r = step()
        if type(r) == "table" then
          -- Under mpirun the speed differs per rank; loss, lr and norm are global, so the
          -- ranks' lines group into one.
          local speed = spmd and "" or ("  %.0f tok/s"):format(r.tokens_per_s or 0)
          print(("step %d  loss %.4f  lr %.3g  grad norm %.3g%s"):format(
            r.step or 0, r.loss or 0, r.lr or 0, r.grad_norm or 0, speed))
        end
        -- Under mpirun the lines come back when the command ends; meanwhile rank 0's
        -- terminal shows its latest step on one line that the answers replace.
        if live_status and type(r) == "table" then
          live_status(("[0] step %d  loss %.4f  (%d of %d; Ctrl-C stops)"):format(
            r.step or 0, r.loss or 0, i, n))
        end
        if i < n and interrupt_requested() then
          print(("interrupted (Ctrl-C) after %d of %d steps"):format(i, n))
          return
        end
      end
    end)
  end

  -- For a loop of one's own: `while not interrupted() do ... end`. Under mpirun every
  -- rank running the line must call it alike (the answer is agreed between them).
  function env.interrupted() return interrupt_requested() end

  function env.full(t)
    if not is_tensor(t) then error("full(t): t must be a tensor", 2) end
    local pl = find_placement(env, t)
    if not (pl and pl.split) then return t end
    local T = require("tetra.tensor")
    return T.no_grad(function()
      -- Each tp rank writes its rows into zeros; the sum over the group is the whole.
      local whole = T.zeros(pl.shape, { dtype = t.dtype })
      whole:narrow(pl.dim, pl.offset, pl.length):copy_(t)
      return env.mesh.tp:all_reduce(whole, "sum")
    end)
  end
end

-- -- Loading FILE into the session ---------------------------------------------------

-- env.step as the recipe built it, wrapped: Ctrl-C is honoured after the step, never
-- inside it.
local function wrap_step(env)
  local raw = rawget(env, "step")
  if type(raw) ~= "function" then return end
  raw_steps[env] = raw
  local function step_then_check(...)
    local r = raw(...)
    return r, interrupt_requested()
  end
  env.step = function(...)
    local r, stop = uninterrupted(step_then_check, ...)
    if stop then
      errors.raise("interrupted (Ctrl-C) after step %s",
                   tostring(type(r) == "table" and r.step or "?"))
    end
    return r
  end
end

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
  wrap_step(env)
end

-- -- Live re-layout ----------------------------------------------------------------

local function deep_copy(v)
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = deep_copy(x) end
  return out
end

local function layout_text(cfg)
  local s = layout.sizes(cfg)
  return ("tp=%d cp=%d dp=%d pp=%d"):format(s.tp, s.cp, s.dp, s.pp)
end

-- A directory every rank names alike (rank 0's pid, agreed over the world).
local function relayout_dir(mesh)
  local ffi = require("ffi")
  pcall(ffi.cdef, "int getpid(void);")
  local T = require("tetra.tensor")
  local pid = T.full({ 1 }, mesh.rank == 0 and ffi.C.getpid() or 0, { dtype = "i32" })
  mesh.world:all_reduce(pid, "max")
  return ("%s/tetra-relayout-%d"):format(os.getenv("TMPDIR") or "/tmp",
                                         pid:data_ptr("int32_t *")[0])
end

-- relayout{ tp =, pp =, cp =, dp = } (missing: 1; dp: what the world size leaves): the
-- same model and optimizer state in a new layout of the same ranks. The state goes
-- through a checkpoint (saved in this layout, loaded into the new one: the reshard path
-- tetra.checkpoint has for any layout), so training goes on as a run resumed in the new
-- layout would. Every rank runs it.
local function add_relayout(env)
  function env.relayout(spec)
    if type(spec) ~= "table" then
      error("relayout{ tp = 2, pp = 2 }: give the new sizes in a table", 2)
    end
    local recipe, mesh = rawget(env, "recipe"), rawget(env, "mesh")
    if not (recipe and recipe.setup and mesh and rawget(env, "optimizer")) then
      error("relayout() needs the session of a recipe (tetra -i RECIPE)", 2)
    end
    for k, v in pairs(spec) do
      if not layout.size_keys[k] then
        error(("relayout: unknown key '%s' (tp, cp, pp, dp)"):format(tostring(k)), 2)
      end
      if type(v) ~= "number" or v < 1 or v % 1 ~= 0 then
        error(("relayout: %s must be a positive whole number, got %s"):format(k, tostring(v)), 2)
      end
    end
    local world = mesh.size
    local sizes = { tp = spec.tp or 1, cp = spec.cp or 1, pp = spec.pp or 1 }
    sizes.dp = spec.dp or math.max(1, math.floor(world / (sizes.tp * sizes.cp * sizes.pp)))
    local cfg = deep_copy(env.cfg)
    cfg.parallel = cfg.parallel or {}
    for k, key in pairs(layout.size_keys) do cfg.parallel[key] = sizes[k] end
    local problems = layout.problems(cfg, world)
    if #problems > 0 then
      errors.raise("relayout: %s", table.concat(problems, "; "))
    end
    -- The recipe's own env holds the live state (its step() counts in it).
    local current = rawget(env, "env") or env
    local checkpoint = require("tetra.checkpoint")
    local dir = relayout_dir(mesh)
    local saved_ck = current.cfg.checkpoint
    current.cfg.checkpoint = { dir = dir, keep = 0 }
    local ok, path = pcall(checkpoint.save, current)
    current.cfg.checkpoint = saved_ck
    if not ok then error(path, 0) end
    local from = layout_text(env.cfg)
    cfg.checkpoint = deep_copy(saved_ck) or {}
    cfg.checkpoint.resume = nil
    local built
    ok, built = pcall(function()
      local b = recipe.setup(cfg)
      checkpoint.load(b, path)
      return b
    end)
    mesh.world:barrier()
    -- A scratch copy: failing to remove it must not hide how the load went.
    if mesh.rank == 0 then pcall(fs.remove_tree, dir, "relayout") end
    if not ok then error(built, 0) end
    for k, v in pairs(built) do env[k] = v end
    env.env, env.cfg = built, cfg
    wrap_step(env)
    collectgarbage("collect")
    print(("relayout: %s -> %s at step %d"):format(from, layout_text(cfg), built.step_count))
  end
end

-- -- Reading chunks --------------------------------------------------------------------

local function history_path()
  local p = os.getenv("TETRA_HISTORY")
  if p then return p ~= "" and p or nil end
  local home = os.getenv("HOME")
  return home and (home .. "/.tetra_history") or nil
end

-- A parse error that more lines can fix: the chunk stopped inside a block, a call, a
-- table or a long string. "'=' expected near '<eof>'" is not one: the chunk ended with
-- an expression where a statement was due (`x = 1; x`), which no next line completes.
local function is_incomplete(err)
  return err:match("near '<eof>'$") ~= nil and not err:match("'=' expected near '<eof>'$")
end

-- "statements; expression": the statements run and the expression's value prints, as
-- for a lone expression. The split is at the last `;` or newline where both sides are
-- complete on their own, so one inside a block (`for ... do f(); g() end`) never splits.
local function compile_with_tail_expression(buf)
  for i = #buf, 1, -1 do
    local c = buf:sub(i, i)
    if c == ";" or c == "\n" then
      local head, tail = buf:sub(1, i), buf:sub(i + 1)
      if tail:match("%S") and loadstring("return " .. tail, "=stdin") and
         loadstring(head, "=stdin") then
        return loadstring(head .. " return " .. tail, "=stdin")
      end
    end
  end
end

-- Compiles a (possibly partial) chunk: returns fn, or nil + "incomplete", or nil + message.
local function compile(buf, env)
  local fn = loadstring("return " .. buf, "=stdin") or compile_with_tail_expression(buf)
  if not fn then
    local err
    fn, err = loadstring(buf, "=stdin")
    if not fn then
      if is_incomplete(err) then return nil, "incomplete" end
      return nil, err
    end
  end
  setfenv(fn, env)
  -- Compiled traces never call debug hooks, so a loop typed at the prompt runs in the
  -- interpreter, where Ctrl-C can stop it; library code it calls is still compiled.
  jit.off(fn, true)
  return fn
end
M.compile = compile

-- -- Completion ----------------------------------------------------------------------

local KEYWORDS = { "and", "break", "do", "else", "elseif", "end", "false", "for",
                   "function", "goto", "if", "in", "local", "nil", "not", "or", "repeat",
                   "return", "then", "true", "until", "while" }

-- Identifier keys of v and of the tables its metatable's __index chain reaches (a
-- module's class and base classes; _G behind the session env); a tensor's methods.
-- Functions only when methods_only.
local function fields_of(v, methods_only)
  local out, seen = {}, {}
  local function add(k, val)
    if type(k) == "string" and k:match("^[%a_][%w_]*$") and not seen[k] and
       (not methods_only or type(val) == "function") then
      seen[k] = true
      out[#out + 1] = k
    end
  end
  if is_tensor(v) then
    for k, f in pairs(require("tetra.tensor").methods) do add(k, f) end
    return out
  end
  local t = v
  for _ = 1, 8 do
    if type(t) ~= "table" then break end
    for k, val in pairs(t) do add(k, val) end
    local mt = getmetatable(t)
    local idx = type(mt) == "table" and rawget(mt, "__index") or nil
    if idx == t then break end
    t = idx
  end
  return out
end

-- The value a path such as `model.layers[1].attention` names, by indexing only (nothing
-- is called); nil when it names nothing.
local function resolve(env, path)
  local name, pos = path:match("^([%a_][%w_]*)()")
  if not name then return nil end
  local ok, v = pcall(function() return env[name] end)
  if not ok then return nil end
  while pos <= #path do
    local key, nxt = path:match("^%.([%a_][%w_]*)()", pos)
    if not key then
      key, nxt = path:match("^%[(%d+)%]()", pos)
      key = tonumber(key)
    end
    if not key then
      key, nxt = path:match('^%["([^"]*)"%]()', pos)
    end
    if key == nil or v == nil then return nil end
    if type(v) ~= "table" and not is_tensor(v) then return nil end
    ok, v = pcall(function() return v[key] end)
    if not ok then return nil end
    pos = nxt
  end
  return v
end

-- Candidates for the word before the cursor (each a whole replacement of the word).
function M.completions(env, word)
  local out = {}
  local prefix, sep, partial = word:match("^(.*)([%.:])([%w_]*)$")
  if prefix then
    local v = resolve(env, prefix)
    if v == nil then return out end
    for _, k in ipairs(fields_of(v, sep == ":")) do
      if k:sub(1, #partial) == partial then out[#out + 1] = prefix .. sep .. k end
    end
  else
    local names = fields_of(env)
    for _, k in ipairs(KEYWORDS) do names[#names + 1] = k end
    for _, k in ipairs(names) do
      if k:sub(1, #word) == word then out[#out + 1] = k end
    end
  end
  table.sort(out)
  return out
end

-- -- Running chunks ------------------------------------------------------------------

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
  local interrupted = msg:match("interrupted %(Ctrl%-C%)$")
  if #lines > 0 and not interrupted and not (type(err) == "table" and err.user) then
    msg = msg .. "\nstack traceback:\n" .. table.concat(lines, "\n")
  end
  return msg
end

local function format_time(s)
  if s < 1e-3 then return ("%.0f us"):format(s * 1e6) end
  if s < 1 then return ("%.1f ms"):format(s * 1e3) end
  return ("%.2f s"):format(s)
end

-- Runs one complete chunk; `write` receives what it prints (its results, or "error: ...").
-- Ctrl-C may stop plain Lua code anywhere (a single process only: under mpirun a rank
-- stopped alone would leave the others waiting in a collective).
local function run_chunk(fn, write)
  host.interrupted(true)
  set_lua_interruptible(not spmd)
  local res = { xpcall(fn, on_error) }
  set_lua_interruptible(false)
  host.interrupted(true)
  if not res[1] then
    write("error: " .. tostring(res[2]) .. "\n")
  else
    local n = table.maxn(res)
    if n > 1 then
      local parts = {}
      for i = 2, n do parts[#parts + 1] = pretty(res[i]) end
      write(table.concat(parts, "\t") .. "\n")
    end
  end
end

-- -- The SPMD session (under mpirun) -------------------------------------------------

M.rank_ranges, M.group_answers = channel.rank_ranges, channel.group_answers

-- Runs a compiled line on this rank if chosen, capturing what it prints.
local function run_captured(fn)
  local buf = {}
  local function write(s) buf[#buf + 1] = s end
  local saved_print, saved_write = print, io.write
  _G.print = function(...)
    local n, parts = select("#", ...), {}
    for i = 1, n do parts[i] = tostring((select(i, ...))) end
    write(table.concat(parts, "\t") .. "\n")
  end
  _G.io.write = function(...)
    for i = 1, select("#", ...) do write(tostring((select(i, ...)))) end
    return io.stdout
  end
  run_chunk(fn, write)
  _G.print, _G.io.write = saved_print, saved_write
  return table.concat(buf)
end

-- -- The loops -----------------------------------------------------------------------

-- One prompt's worth of reading: returns a complete chunk's text and its function, or
-- nil at end of input. Syntax errors print and reading goes on.
local function read_chunk(env, out, hist)
  local buf = nil
  while true do
    local line = host.readline(buf and ">> " or "tetra> ")
    if line == nil then
      if buf then out("error: incomplete statement at end of input\n") end
      return nil
    end
    if line == false then
      buf = nil    -- Ctrl-C: the line (and any statement begun) is dropped
    else
      if buf then buf = buf .. "\n" .. line else buf = line end
      if buf:match("^%s*$") then
        buf = nil
      elseif buf:match("^%s*%%") then
        if hist then host.add_history(buf) end
        return buf
      else
        local fn, err = compile(buf, env)
        if fn then
          if hist then host.add_history(buf) end
          return buf, fn
        elseif err ~= "incomplete" then
          if hist then host.add_history(buf) end
          buf = nil
          out("error: " .. err .. "\n")
        end
      end
    end
  end
end

local function stdout_writer(s)
  io.stdout:write(s)
  io.stdout:flush()
end

local function single_loop(env, tty, hist)
  local done = false
  env.exit = function() done = true end
  env.quit = env.exit
  while not done do
    local text, fn = read_chunk(env, stdout_writer, hist)
    if not text then break end
    if not fn then
      stdout_writer("error: %-commands (" .. text:match("^%s*(%S*)") .. ") are for " ..
                    "sessions under mpirun\n")
    else
      local t0 = host.now()
      run_chunk(fn, stdout_writer)
      stdout_writer("(" .. format_time(host.now() - t0) .. ")\n")
    end
  end
  if tty then stdout_writer("\n") end
end

-- Rank 0 reads and shows; every rank runs. Rank 0's output goes to the terminal it took
-- (stdout when it has none: piped sessions), so answers and prompts stay in order.
local function spmd_loop(env, ch, tty, hist)
  local done = false
  env.exit = function() done = true end
  env.quit = env.exit
  local out = tty and host.tty_write or stdout_writer
  if ch.rank == 0 and tty then
    live_status = function(text) host.tty_write("\r\27[K" .. text) end
  end
  while true do
    local kind, text = channel.CMD_EXIT, ""
    if ch.rank == 0 then
      while true do
        local chunk, fn = read_chunk(env, out, hist)
        if not chunk then break end
        if fn then kind, text = channel.CMD_RUN, chunk; break end
        local cmd, arg = chunk:match("^%s*%%(%S+)%s*(.-)%s*$")
        if cmd == "on" then
          if arg == "" then
            out("%on " .. ch.on_spec .. "\n")
          else
            local ok, err = channel.on_spec_selects(arg, 0, ch.size, rawget(env, "mesh"))
            if ok == nil then out("error: " .. err .. "\n") else kind, text = channel.CMD_ON, arg; break end
          end
        else
          out("error: unknown command %" .. tostring(cmd) .. " (%on RANKS | %on tp=0 | %on all)\n")
        end
      end
    end
    kind, text = ch:broadcast(kind, text)
    if kind == channel.CMD_EXIT then break end
    local t0 = host.now()
    if kind == channel.CMD_ON then
      ch:select(text, env)
      if ch.rank == 0 then
        local ranks = {}
        for r = 0, ch.size - 1 do if ch.members[r + 1] then ranks[#ranks + 1] = r end end
        out("lines run on ranks " .. channel.rank_ranges(ranks) .. "\n")
      end
    else
      ch:begin_line()
      local answer = "\1"   -- "did not run"
      if ch.selected then
        local fn = compile(text, env)
        answer = run_captured(fn)
      end
      local tokens_sent = false
      local function on_poll()
        -- Rank 0 waits while others still run: Ctrl-C goes to them as a token, once;
        -- later ones are left to count towards ending the session (engine/host/main.c).
        if ch.rank == 0 and not tokens_sent and host.interrupted(true) then
          tokens_sent = true
          ch:send_interrupt()
        end
      end
      if ch.rank == 0 and tty then host.tty_write("\r\27[K") end   -- the live line goes
      local all = ch:gather(answer, on_poll)
      ch:end_line()
      if all then
        for r = 1, ch.size do if all[r] == "\1" then all[r] = nil end end
        local shown = channel.group_answers(all, ch.size)
        if shown ~= "" then out(shown .. "\n") end
        out("(" .. format_time(host.now() - t0) .. ")\n")
      end
      -- exit() on the ranks that ran it; rank 0 decides for all.
      if ch.rank == 0 and done then
        ch:broadcast(channel.CMD_EXIT, "")
        break
      end
    end
    if ch.rank ~= 0 then done = false end
  end
  if tty and ch.rank == 0 then out("\n") end
end

function M.new_env()
  local env = setmetatable({}, { __index = _G })
  env.tetra = require("tetra")
  make_helpers(env)
  add_relayout(env)
  return env
end

-- Under mpirun with more than one rank, the channel between them (nil otherwise).
local function open_channel()
  local dist = require("tetra.dist")
  if not dist.launched() or dist.world_size() < 2 then return nil end
  return channel.new()
end

-- Reads and runs commands until end of input or exit(). Returns the exit code.
function M.loop(env)
  spmd = open_channel()
  if spmd then
    env.rank = rawget(env, "rank") or spmd.rank
    env.world_size = spmd.size
  end
  local rank0 = not spmd or spmd.rank == 0
  local tty = rank0 and host.isatty(0)
  -- Under mpirun rank 0's stdin is mpirun's pipe: the terminal is opened directly.
  if spmd and rank0 and not tty and os.getenv("TETRA_REPL_NO_TTY") ~= "1" then
    tty = host.take_terminal() and true or false
  end
  if tty then host.catch_interrupts() end
  local hist = tty and host.have_libedit and history_path()
  if hist then host.history(hist, "load") end
  if tty then
    host.set_completer(function(word) return M.completions(env, word) end)
    local where = spmd and (", %d ranks: lines run on all, %%on chooses"):format(spmd.size) or ""
    local banner = ("tetra %s -- Lua with tensors%s. help() lists the helpers; Ctrl-D leaves.\n")
                   :format(host.version, where)
    if spmd then host.tty_write(banner) else stdout_writer(banner) end
  end
  -- The terminal goes back to mpirun whatever happens in the loop.
  local ok, err = pcall(function()
    if spmd then spmd_loop(env, spmd, tty, hist) else single_loop(env, tty, hist) end
  end)
  if hist then host.history(hist, "save") end
  if spmd and tty then host.give_back_terminal() end
  if not ok then error(err, 0) end
  return 0
end

-- `tetra` / `tetra -i FILE [--set k=v]...`
function M.main(file, sets)
  local env = M.new_env()
  if file then
    local config = require("tetra.config")
    -- Config and layout errors are the same on every rank: printed once (by rank 0).
    local function keep_user_errors(e)
      if config.is_error(e) or (type(e) == "table" and e.user) then return e end
      return on_error(e)
    end
    local ok, err = xpcall(M.load_into, keep_user_errors, env, file, sets)
    if not ok then
      if type(err) == "table" then return config.report(err) end
      io.stderr:write("tetra: ", tostring(err), "\n")
      return 1
    end
  end
  return M.loop(env)
end

return M
