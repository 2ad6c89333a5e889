-- tetra.repl.session: what a REPL session's parts share: the ranks' channel under
-- mpirun, Ctrl-C (recorded, honoured at safe points, agreed between the ranks) and the
-- recipe's step() wrapped so that it is never stopped half-way.
local host = require("tetra.host")
local errors = require("tetra.util.errors")

local M = {}

-- -- Interrupts ------------------------------------------------------------------------

-- M.spmd: the channel between the ranks when the session runs under mpirun (set by the
-- loop); M.live_status: f(text), rank 0's one-line progress on its terminal under mpirun.
M.spmd, M.live_status = nil, nil

-- Whether Ctrl-C asked the running command to stop (the request is consumed). Under
-- mpirun every rank running the command calls this at the same point and gets the same
-- answer, so they all stop after the same step.
function M.interrupt_requested()
  if M.spmd then return M.spmd:agree_interrupt() end
  return host.interrupted(true)
end

-- Runs fn(...) with Ctrl-C only recorded, never raised inside it: a step stopped half-way
-- would leave gradients and the tape behind (and, under mpirun, ranks in a collective).
local lua_interruptible = false
function M.set_lua_interruptible(on)
  lua_interruptible = on
  host.interrupt_lua(on)
end

function M.uninterrupted(fn, ...)
  local was = lua_interruptible
  M.set_lua_interruptible(false)
  local res = { pcall(fn, ...) }
  M.set_lua_interruptible(was)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

-- The recipe's own step() for each session env; env.step is wrapped (see load_into).
M.raw_steps = setmetatable({}, { __mode = "k" })

-- env.step as the recipe built it, wrapped: Ctrl-C is honoured after the step, never
-- inside it.
function M.wrap_step(env)
  local raw = rawget(env, "step")
  if type(raw) ~= "function" then return end
  M.raw_steps[env] = raw
  local function step_then_check(...)
    local r = raw(...)
    return r, M.interrupt_requested()
  end
  env.step = function(...)
    local r, stop = M.uninterrupted(step_then_check, ...)
    if stop then
      errors.raise("interrupted (Ctrl-C) after step %s",
                   tostring(type(r) == "table" and r.step or "?"))
    end
    return r
  end
end

return M
