-- tetra trace merge OUT.json FILE...
--
-- Merges the per-rank traces log.trace_steps wrote (trace-rank<R>.json, already on rank
-- 0's clock) into one Chrome/Perfetto timeline with a process per rank. Exit 2 with one
-- line on bad usage or a file that is not such a trace.
local M = {}

local USAGE = "usage: tetra trace merge OUT.json trace/trace-rank*.json"

local usage_error = require("tetra.util.errors").usage("tetra trace", USAGE)

-- The event lines of one rank's file (one JSON object per line between the header and
-- the footer tetra.obs.trace writes), or nil and a message.
function M.read_events(path)
  local f, err = io.open(path, "r")
  if not f then return nil, "cannot read " .. path .. ": " .. tostring(err) end
  local lines = {}
  for line in f:lines() do lines[#lines + 1] = line end
  f:close()
  if lines[1] ~= '{"displayTimeUnit":"ms","traceEvents":[' or lines[#lines] ~= "]}" then
    return nil, path .. ": not a trace written by log.trace_steps"
  end
  local events = {}
  for i = 2, #lines - 1 do
    local e = lines[i]:gsub(",$", "")
    if not e:match('^{.*"ph":"[XM]".*}$') then
      return nil, string.format("%s:%d: not a trace event", path, i)
    end
    events[#events + 1] = e
  end
  return events
end

function M.main(cmd, out, ...)
  if cmd == "--help" or cmd == "-h" then
    print(USAGE)
    return 0
  end
  if cmd ~= "merge" then return usage_error("unknown subcommand " .. tostring(cmd)) end
  local files = { ... }
  if not out or #files == 0 then return usage_error("merge needs OUT.json and trace files") end
  for _, p in ipairs(files) do
    if p == out then return usage_error(out .. " is also an input") end
  end
  local all = {}
  for _, p in ipairs(files) do
    local events, err = M.read_events(p)
    if not events then return usage_error(err) end
    for _, e in ipairs(events) do all[#all + 1] = e end
  end
  local f, err = io.open(out, "w")
  if not f then return usage_error("cannot write " .. out .. ": " .. tostring(err)) end
  f:write('{"displayTimeUnit":"ms","traceEvents":[\n', table.concat(all, ",\n"), "\n]}\n")
  f:close()
  print(string.format("%s: %d events from %d ranks", out, #all, #files))
  return 0
end

return M
