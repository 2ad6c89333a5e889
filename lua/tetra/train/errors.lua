-- tetra.train.errors: the user-facing error of the training modules (setup, sources,
-- device, step, loop): the tetra binary prints its message alone, without a traceback.
local errors = {}

function errors.user_error(msg)
  error(setmetatable({ message = msg, user = true },
                     { __tostring = function(e) return e.message end }), 0)
end

return errors
