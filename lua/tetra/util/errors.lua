-- tetra.util.errors: the one user-error type, and the CLI's usage error.
--
-- A user error is what the user must fix (a bad key, a missing file): the tetra binary
-- (engine/host/main.c's msg_handler) prints a table error's `message` alone, as one
-- line, without a Lua traceback. Anything else raised is a bug and keeps its traceback.
--
--   errors.raise("checkpoint: %s is missing", path)   -- raises a user error
--   errors.new(msg, "config")                          -- the error object, of a kind
--   errors.is(e [, "config"])                          -- is e one (of that kind)?
--   local usage_error = errors.usage("tetra plot", "see tetra plot --help")
--   return usage_error("no OUT_DIR")   -- "tetra plot: no OUT_DIR (see ...)", exit code 2
local M = {}

-- The exit code of a command given bad arguments.
M.EXIT_USAGE = 2

local UserError = {}
UserError.__index = UserError
UserError.__tostring = function(e) return e.message end

-- The error object: { message =, user = true, kind = }. `user` is what code that does
-- not know this module tests (config.run_file, the REPL, specs); `kind` tells errors
-- that are reported differently apart (config errors: "config", printed by rank 0 only).
function M.new(message, kind)
  return setmetatable({ message = message, user = true, kind = kind }, UserError)
end

function M.is(e, kind)
  return getmetatable(e) == UserError and (kind == nil or e.kind == kind)
end

-- fmt is formatted only when arguments follow it, so that a message taken as it is (from
-- tt_last_error, a file name) may hold a '%'.
local function message(fmt, ...)
  if select("#", ...) == 0 then return fmt end
  return fmt:format(...)
end

-- Raises a user error; level 0: the message is the user's, not a position in Tetra.
function M.raise(fmt, ...)
  error(M.new(message(fmt, ...)), 0)
end

-- A usage-error reporter for the command `command` ("tetra plot"): the function returned
-- writes "command: MESSAGE (hint)" (no hint: no parentheses) on stderr and returns
-- EXIT_USAGE, for `return usage_error(...)` in a command's main.
function M.usage(command, hint)
  local tail = hint and " (" .. hint .. ")\n" or "\n"
  return function(fmt, ...)
    io.stderr:write(command, ": ", message(fmt, ...), tail)
    io.stderr:flush()
    return M.EXIT_USAGE
  end
end

return M
