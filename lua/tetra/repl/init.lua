-- tetra.repl: the interactive prompt (`tetra`, `tetra -i FILE`): reading, running and
-- the loops, single and SPMD. Its parts: show (values as text), session (Ctrl-C, the
-- ranks' channel, step()), helpers (inspect, probe ...), relayout, complete, channel.
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
local channel = require("tetra.repl.channel")
local show = require("tetra.repl.show")
local session = require("tetra.repl.session")
local helpers = require("tetra.repl.helpers")
local relayout = require("tetra.repl.relayout")
local complete = require("tetra.repl.complete")

local M = {}

M.pretty, M.completions = show.pretty, complete.completions

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
  session.wrap_step(env)
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

-- -- Running chunks ------------------------------------------------------------------

-- Keeps the traceback up to the user's own chunk.
local function on_error(err)
  local msg = type(err) == "table" and err.message or tostring(err)
  local tb = debug.traceback("", 2)
  local lines = {}
  for line in tb:gmatch("[^\n]+") do
    if line:find("tetra/repl/", 1, true) or line:find("in function 'xpcall'", 1, true) then break end
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
  session.set_lua_interruptible(not session.spmd)
  local res = { xpcall(fn, on_error) }
  session.set_lua_interruptible(false)
  host.interrupted(true)
  if not res[1] then
    write("error: " .. tostring(res[2]) .. "\n")
  else
    local n = table.maxn(res)
    if n > 1 then
      local parts = {}
      for i = 2, n do parts[#parts + 1] = show.pretty(res[i]) end
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
    session.live_status = function(text) host.tty_write("\r\27[K" .. text) end
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
        -- later ones are left to count towards ending the session (engine/host/terminal.c).
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
  helpers.add(env)
  relayout.add(env)
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
  local spmd = open_channel()
  session.spmd = spmd
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
    host.set_completer(function(word) return complete.completions(env, word) end)
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
