-- tetra monitor-config HOSTFILE --port BASE [--np N] [--job NAME] [--interval DUR]
--
-- Prints a Prometheus scrape config (YAML) for a job started with `mpirun --hostfile
-- HOSTFILE -np N`: Open MPI fills each host's slots in order, so host h runs local ranks
-- 0 .. k-1 and serves them on ports BASE .. BASE + k - 1 (log.prometheus_port=BASE).
-- honor_labels keeps the job label the ranks report. Without --np every slot is counted.
-- Exit 2 with one line on bad usage or a hostfile line it cannot read.
local M = {}

local USAGE = "usage: tetra monitor-config HOSTFILE --port BASE [--np N] [--job NAME] " ..
              "[--interval 15s]"

local usage_error = require("tetra.util.errors").usage("tetra monitor-config", USAGE)

-- The hostfile's hosts in order: { { host =, slots = } ... }, or nil and a message.
-- Lines: "host slots=N [max_slots=M]"; # starts a comment.
function M.read_hostfile(path)
  local f, err = io.open(path, "r")
  if not f then return nil, "cannot read " .. path .. ": " .. tostring(err) end
  local hosts, n = {}, 0
  for line in f:lines() do
    n = n + 1
    line = line:gsub("#.*", "")
    local host, rest = line:match("^%s*(%S+)%s*(.-)%s*$")
    if host then
      local slots
      for k, v in rest:gmatch("([%w_]+)%s*=%s*(%S+)") do
        if k == "slots" then slots = tonumber(v) end
      end
      if not slots or slots < 1 or slots ~= math.floor(slots) then
        f:close()
        return nil, string.format("%s:%d: '%s' needs slots=N (the ranks that host runs)",
                                  path, n, host)
      end
      hosts[#hosts + 1] = { host = host, slots = slots }
    end
  end
  f:close()
  if #hosts == 0 then return nil, path .. ": no hosts" end
  return hosts
end

-- host:port targets of np ranks laid out by slot over hosts.
function M.targets(hosts, base, np)
  local out, left = {}, np
  for _, h in ipairs(hosts) do
    local k = math.min(h.slots, left)
    for local_rank = 0, k - 1 do
      out[#out + 1] = h.host .. ":" .. (base + local_rank)
    end
    left = left - k
    if left == 0 then break end
  end
  return out
end

function M.main(...)
  local args = { ... }
  local opts, path = { job = "tetra", interval = "15s" }, nil
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--help" or a == "-h" then
      print(USAGE)
      return 0
    elseif a == "--port" or a == "--np" or a == "--job" or a == "--interval" then
      if not args[i + 1] then return usage_error(a .. " needs a value") end
      opts[a:sub(3)] = args[i + 1]
      i = i + 2
    elseif a:sub(1, 1) == "-" then
      return usage_error("unknown option " .. a)
    elseif path then
      return usage_error("one HOSTFILE only, got " .. path .. " and " .. a)
    else
      path, i = a, i + 1
    end
  end
  if not path then return usage_error("no HOSTFILE") end
  local base = tonumber(opts.port)
  if not base or base < 1 or base > 65535 or base ~= math.floor(base) then
    return usage_error(opts.port and "--port needs a TCP port, got " .. opts.port or
                       "--port BASE (log.prometheus_port) is required")
  end
  if not opts.job:match("^[%w_.:-]+$") then
    return usage_error("--job: letters, digits and _ . : - only")
  end
  if not opts.interval:match("^%d+[mun]?s$") and not opts.interval:match("^%d+[mh]$") then
    return usage_error("--interval needs a duration such as 15s or 500ms")
  end
  local hosts, err = M.read_hostfile(path)
  if not hosts then return usage_error(err) end
  local total, widest = 0, 0
  for _, h in ipairs(hosts) do
    total = total + h.slots
    widest = math.max(widest, h.slots)
  end
  local np = total
  if opts.np then
    np = tonumber(opts.np)
    if not np or np < 1 or np ~= math.floor(np) then
      return usage_error("--np needs a rank count, got " .. opts.np)
    end
    if np > total then
      return usage_error(string.format("--np %d is more than the hostfile's %d slots", np,
                                       total))
    end
  end
  if base + widest - 1 > 65535 then
    return usage_error(string.format("--port %d + %d local ranks passes 65535", base, widest))
  end
  local out = {
    "# Prometheus scrape config for tetra (" .. np .. " ranks from " .. path .. ").",
    "# The ranks must listen beyond loopback: run with --set log.prometheus_port=" .. base,
    "# --set log.prometheus_addr=0.0.0.0 (or each node's address) for a remote Prometheus.",
    "scrape_configs:",
    "  - job_name: " .. opts.job,
    "    honor_labels: true",
    "    scrape_interval: " .. opts.interval,
    "    static_configs:",
    "      - targets:",
  }
  for _, t in ipairs(M.targets(hosts, base, np)) do out[#out + 1] = "          - '" .. t .. "'" end
  print(table.concat(out, "\n"))
  return 0
end

return M
