-- tetra launch: a supervisor that restarts a failed training job from its latest
-- checkpoint.
--
--   tetra launch [--max-restarts N] [--min-np M] [--backoff S] -- \
--       mpirun -np 4 tetra run CONFIG --set checkpoint.dir=ckpt ...
--
-- The command after `--` runs as a child process. When it exits with a non-zero status
-- (a rank killed, a Lua error, the watchdog's abort of a hung collective) it is started
-- again with `--set checkpoint.resume=auto` (every other `checkpoint.resume` is replaced:
-- a restart always continues from checkpoint.dir/latest), after a wait of S seconds that
-- doubles with each restart that made no progress since the last one (capped at 60 s).
-- It gives up:
--   * after N restarts (--max-restarts, default 10);
--   * when the job fails twice in a row the same way: the same exit status, below 128 (a
--     status of 128 + n is a death by signal n, something done to the job, not by it),
--     after the same last completed step. The job's rank 0 writes its last completed
--     step to the file TETRA_LAUNCH_STATUS names (tetra.train does; a temporary file
--     unless the variable is set already, e.g. to a path on a shared file system when
--     rank 0 runs on another node); a run that fails at the same step with the same
--     status again would fail a third time.
-- SIGUSR1 sent to the supervisor goes on to the job; a job that then stops after saving a
-- checkpoint (exit status 3, tetra.train.loop) is not restarted: the supervisor exits 3.
-- Every restart is one line on stderr with its number and cause, and the job sees the
-- count in the environment variable TETRA_RESTART_COUNT (0 for the first start; the
-- metrics records carry it as `restarts`). Under mpirun both variables are also passed
-- on with -x, for ranks on other nodes.
--
-- Elastic (--min-np M): before each start the supervisor counts the slots of the
-- hostfile the command names (--hostfile / -hostfile / --machinefile: one host per line,
-- `slots=K`, 1 when absent). A node lost from the allocation is a hostfile with fewer
-- slots. When fewer slots remain than -np asks for, the job continues on the largest
-- process count n <= slots, n >= M, that keeps the non-data-parallel part of the layout
-- (np / data_parallel_size): -np becomes n and parallel.data_parallel_size shrinks in
-- proportion. The global batch (train.batch_size) and the data order do not depend on
-- the data-parallel size, so the run continues the same optimisation. Below M slots it
-- gives up. The command must then name parallel.data_parallel_size with --set.
-- Dead hosts are found by the supervisor itself: before each start every host of the
-- hostfile but this one is probed through the rsh agent mpirun would use (the command's
-- `-mca plm_rsh_agent`, else OMPI_MCA_plm_rsh_agent, else ssh) by running `true` there,
-- all at once, each given --probe-timeout seconds (default 10); a host that does not
-- answer is left out of a hostfile of the live hosts that the job is started with.
-- Grow back (--grow-every S, default 30; 0: never): while the job runs on fewer processes
-- than it asked for, the hosts left out are probed every S seconds; when they answer
-- again so that a larger job fits, the supervisor waits for the job's next checkpoint
-- (checkpoint.dir/latest changes; at most --grow-wait seconds, default 600), stops the
-- job (SIGTERM to the command) and starts it again on the larger layout from that
-- checkpoint (guide 7.3: a smaller cluster while warming up, a larger one later).
local ffi = require("ffi")

local M = {}

ffi.cdef [[
typedef int tt_launch_pid_t;
int tt_launch_posix_spawnp(tt_launch_pid_t *pid, const char *file, const void *file_actions,
                           const void *attrp, char *const argv[], char *const envp[])
    __asm__("posix_spawnp");
tt_launch_pid_t tt_launch_waitpid(tt_launch_pid_t pid, int *status, int options) __asm__("waitpid");
int tt_launch_setenv(const char *name, const char *value, int overwrite) __asm__("setenv");
int tt_launch_usleep(unsigned int usec) __asm__("usleep");
int tt_launch_kill(tt_launch_pid_t pid, int sig) __asm__("kill");
int tt_launch_gethostname(char *name, size_t len) __asm__("gethostname");
char *tt_launch_strerror(int errnum) __asm__("strerror");
extern char **environ;
]]
local C = ffi.C

local usage = [[
usage: tetra launch [--max-restarts N] [--min-np M] [--backoff S] -- COMMAND...
  Runs COMMAND (e.g. mpirun -np 4 tetra run CONFIG --set checkpoint.dir=ckpt ...) and
  restarts it from checkpoint.dir/latest when it fails.
  --max-restarts N   give up after N restarts (default 10)
  --min-np M         when the hostfile has fewer slots than -np, continue on fewer
                     processes (not below M), shrinking parallel.data_parallel_size
  --backoff S        seconds before the first restart, doubled after each (default 1)
  With --min-np, the hosts of the hostfile are probed through mpirun's rsh agent before
  each start; those that do not answer are left out:
  --probe-timeout S  seconds a host has to answer the probe (default 10)
  --grow-every S     while running on fewer processes than asked, probe the hosts left
                     out every S seconds and grow back when they answer (default 30;
                     0: never)
  --grow-wait S      how long to wait for the job's next checkpoint before growing
                     (default 600)]]

local function say(fmt, ...)
  io.stderr:write("tetra launch: ", fmt:format(...), "\n")
  io.stderr:flush()
end

local usage_error = require("tetra.util.errors").usage("tetra launch", "see tetra launch --help")

-- -- The command ---------------------------------------------------------------------

local NP_FLAGS = { ["-np"] = true, ["-n"] = true, ["--np"] = true, ["-c"] = true }
local HOSTFILE_FLAGS = { ["--hostfile"] = true, ["-hostfile"] = true,
                         ["--machinefile"] = true, ["-machinefile"] = true }

-- Index of the value of the first flag of `flags` in argv (flag and value as two words,
-- or --flag=value as one), and whether it is the joined form.
local function find_flag(argv, flags)
  for i, a in ipairs(argv) do
    if flags[a] and argv[i + 1] then return i + 1, false end
    local name = a:match("^(%-%-?[%w-]+)=")
    if name and flags[name] then return i, true end
  end
end

local function flag_value(argv, flags)
  local i, joined = find_flag(argv, flags)
  if not i then return nil end
  return joined and argv[i]:match("=(.*)$") or argv[i]
end

local function set_flag(argv, flags, value)
  local i, joined = find_flag(argv, flags)
  argv[i] = joined and (argv[i]:match("^(.-=)") .. value) or value
end

-- Index of the `--set KEY=...` value word for KEY (also --set=KEY=...), or nil.
local function find_set(argv, key)
  local prefix = key .. "="
  for i, a in ipairs(argv) do
    if a == "--set" and argv[i + 1] and argv[i + 1]:sub(1, #prefix) == prefix then return i + 1 end
    if a:sub(1, 6 + #prefix) == "--set=" .. prefix then return i end
  end
end

local function get_set(argv, key)
  local i = find_set(argv, key)
  return i and argv[i]:sub(argv[i]:find("=", #key + 1, true) + 1) or nil
end

local function put_set(argv, key, value)
  local i = find_set(argv, key)
  if i then
    argv[i] = (argv[i]:sub(1, 6) == "--set=" and "--set=" or "") .. key .. "=" .. value
  else
    argv[#argv + 1] = "--set"
    argv[#argv + 1] = key .. "=" .. value
  end
end

local function copy(t)
  local out = {}
  for i, v in ipairs(t) do out[i] = v end
  return out
end

-- The hosts of a hostfile in order: { { name =, slots = } } (nil and a message when it
-- cannot be read).
local function hostfile_hosts(path)
  local f = io.open(path, "r")
  if not f then return nil, "cannot read the hostfile " .. path end
  local hosts = {}
  for line in f:lines() do
    line = line:gsub("#.*$", "")
    local name = line:match("^%s*(%S+)")
    if name then
      hosts[#hosts + 1] = { name = name, line = line,
                            slots = tonumber(line:match("slots%s*=%s*(%d+)")) or 1 }
    end
  end
  f:close()
  return hosts
end

-- The rsh agent mpirun would start its daemons with, as words: the command's
-- `-mca plm_rsh_agent X` (or --mca), else OMPI_MCA_plm_rsh_agent, else ssh (Open MPI's
-- default is "ssh : rsh": the first of the list).
local function rsh_agent(argv)
  local agent
  for i, a in ipairs(argv) do
    if (a == "-mca" or a == "--mca") and argv[i + 1] == "plm_rsh_agent" and argv[i + 2] then
      agent = argv[i + 2]
      break
    end
  end
  agent = agent or os.getenv("OMPI_MCA_plm_rsh_agent")
  if not agent or agent == "" then agent = "ssh" end
  agent = agent:match("^%s*([^:]-)%s*:") or agent
  local words = {}
  for w in agent:gmatch("%S+") do words[#words + 1] = w end
  return words
end

-- This machine's names: a hostfile line naming one runs here, without the agent.
local function is_local(name)
  if name == "localhost" or name:match("^127%.") or name == "::1" then return true end
  local buf = ffi.new("char[256]")
  if C.tt_launch_gethostname(buf, 255) ~= 0 then return false end
  local me = ffi.string(buf)
  return name == me or name == me:match("^[^.]+") or name:match("^[^.]+") == me
end

-- -- Processes -----------------------------------------------------------------------

-- Starts argv (a list of strings; argv[1] looked up in PATH). Returns its pid, or nil and
-- a message.
local function spawn(argv)
  local cargv = ffi.new("char *[?]", #argv + 1)
  local keep = {}
  for i, a in ipairs(argv) do
    keep[i] = ffi.new("char[?]", #a + 1, a)
    cargv[i - 1] = keep[i]
  end
  cargv[#argv] = nil
  local pid = ffi.new("tt_launch_pid_t[1]")
  local rc = C.tt_launch_posix_spawnp(pid, argv[1], nil, nil, cargv, C.environ)
  if rc ~= 0 then return nil, ffi.string(C.tt_launch_strerror(rc)) end
  return pid[0]
end

local WNOHANG = 1
local SIGUSR1 = 10
-- The exit status of a job stopped at SIGUSR1 after its checkpoint (tetra.train.loop's
-- STOPPED_EXIT).
local STOPPED = 3

-- The exit status of process pid (128 + n for a death by signal n); with `poll`, false
-- while it runs. nil and a message when it cannot be waited for.
local function wait_for(pid, poll)
  local status = ffi.new("int[1]")
  while true do
    local got = C.tt_launch_waitpid(pid, status, poll and WNOHANG or 0)
    if got == pid then break end
    if got == 0 then return false end
    if ffi.errno() ~= 4 then return nil, "waitpid: " .. ffi.string(C.tt_launch_strerror(ffi.errno())) end
  end
  local s = status[0]
  local sig = bit.band(s, 0x7f)
  if sig ~= 0 then return 128 + sig end
  return bit.band(bit.rshift(s, 8), 0xff)
end

-- Runs argv and waits for it: its exit status, or nil and a message.
local function run(argv)
  local pid, err = spawn(argv)
  if not pid then return nil, err end
  return wait_for(pid)
end

local function sleep_s(s)
  local us = math.floor(s * 1e6)
  while us > 0 do
    local chunk = math.min(us, 900000)
    C.tt_launch_usleep(chunk)
    us = us - chunk
  end
end

-- Probes the hosts (those not this machine) through the rsh agent (words), all at once,
-- each given timeout_s: the set of names that did not answer.
local function probe(hosts, agent, timeout_s)
  local pids, dead = {}, {}
  for _, h in ipairs(hosts) do
    if not is_local(h.name) and not pids[h.name] then
      local argv = { "sh", "-c", 'exec timeout -k 2 "$0" "$@" >/dev/null 2>&1 </dev/null',
                     tostring(timeout_s) }
      for _, w in ipairs(agent) do argv[#argv + 1] = w end
      argv[#argv + 1] = h.name
      argv[#argv + 1] = "true"
      local pid = spawn(argv)
      if pid then pids[h.name] = pid else dead[h.name] = true end
    end
  end
  for name, pid in pairs(pids) do
    if wait_for(pid) ~= 0 then dead[name] = true end
  end
  return dead
end

-- What checkpoint.dir/latest names now ("" when nothing).
local function latest_of(dir)
  local f = dir and io.open(dir .. "/latest", "r")
  if not f then return "" end
  local s = f:read("*a")
  f:close()
  return s
end

-- The last completed step the job's rank 0 wrote (nil: none written).
local function last_step(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return tonumber(s:match("step (%d+)"))
end

-- A failure's cause in words.
local function describe(status, step)
  local how
  if status >= 128 then
    how = string.format("killed by signal %d (exit %d)", status - 128, status)
  else
    how = string.format("exit %d", status)
  end
  return how .. (step and (" after step " .. step) or " before its first step")
end

-- -- Main ----------------------------------------------------------------------------

local function parse(args)
  local o = { max_restarts = 10, backoff = 1.0, probe_timeout = 10, grow_every = 30,
              grow_wait = 600 }
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--" then
      o.command = { select(i + 1, unpack(args)) }
      break
    elseif a == "--help" or a == "-h" then
      o.help = true
      return o
    elseif a == "--max-restarts" or a == "--min-np" or a == "--backoff" or
           a == "--probe-timeout" or a == "--grow-every" or a == "--grow-wait" then
      local v = tonumber(args[i + 1] or "")
      local seconds = a ~= "--max-restarts" and a ~= "--min-np"
      if not v or v < 0 or (not seconds and v ~= math.floor(v)) or
         (a == "--probe-timeout" and v == 0) then
        return nil, string.format("%s needs a %s, got '%s'", a,
          a == "--probe-timeout" and "number of seconds > 0" or
          seconds and "number of seconds >= 0" or "whole number >= 0",
          tostring(args[i + 1]))
      end
      o[a:sub(3):gsub("-", "_")] = v
      i = i + 1
    else
      return nil, string.format("unknown option '%s' (the command goes after --)", a)
    end
    i = i + 1
  end
  if not o.command or #o.command == 0 then return nil, "no command: put it after --" end
  return o
end

function M.main(...)
  local o, err = parse({ ... })
  if not o then return usage_error("%s", err) end
  if o.help then
    print(usage)
    return 0
  end
  local argv = o.command
  local base = argv[1]:match("[^/]+$")
  if base == "mpirun" or base == "mpiexec" or base == "orterun" then
    table.insert(argv, 2, "-x")
    table.insert(argv, 3, "TETRA_RESTART_COUNT")
    table.insert(argv, 4, "-x")
    table.insert(argv, 5, "TETRA_LAUNCH_STATUS")
    -- A host cut off mid-run ends the job only once mpirun declares it lost, by its oob
    -- keepalive: after 300 + 20 x 9 s of silence by Open MPI's defaults, 5 + 2 x 3 s
    -- here, unless set already (docs/multinode.md, "A host cut off").
    for name, value in pairs({ time = "5", intvl = "2", probes = "3" }) do
      C.tt_launch_setenv("OMPI_MCA_oob_tcp_keepalive_" .. name, value, 0)
    end
  end
  local np = tonumber(flag_value(argv, NP_FLAGS) or "")
  local hostfile = flag_value(argv, HOSTFILE_FLAGS)
  local dp = tonumber(get_set(argv, "parallel.data_parallel_size") or "")
  if o.min_np then
    if not np then return usage_error("--min-np needs the command's process count (-np N)") end
    if not hostfile then
      return usage_error("--min-np needs a hostfile in the command (--hostfile FILE): its " ..
                         "slots say how many processes can run")
    end
    if not dp then
      return usage_error("--min-np needs --set parallel.data_parallel_size=N in the command " ..
                         "(the dimension that shrinks)")
    end
    if o.min_np > np then return usage_error("--min-np %d is above -np %d", o.min_np, np) end
    if np % dp ~= 0 then
      return usage_error("parallel.data_parallel_size=%d does not divide -np %d", dp, np)
    end
  end
  -- Rank 0 may run on another node: TETRA_LAUNCH_STATUS set beforehand (a path on a
  -- shared file system) is kept.
  local status_path = os.getenv("TETRA_LAUNCH_STATUS")
  local own_status = not status_path or status_path == ""
  if own_status then
    status_path = os.tmpname()
    C.tt_launch_setenv("TETRA_LAUNCH_STATUS", status_path, 1)
  end

  local asked_np, asked_dp = np, dp
  local agent = rsh_agent(argv)
  local live_path = status_path .. ".hosts"
  local ckpt_dir = get_set(argv, "checkpoint.dir")

  -- The hostfile's hosts that answer: their slots, the names of those that do not, and
  -- the largest process count of the asked layout (data parallelism shrunk) they hold.
  -- Writes the live hosts' lines to live_path.
  local function live_hosts()
    local hosts, why = hostfile_hosts(hostfile)
    if not hosts then return nil, why end
    local dead = probe(hosts, agent, o.probe_timeout)
    local slots, gone, lines = 0, {}, {}
    for _, h in ipairs(hosts) do
      if dead[h.name] then
        gone[#gone + 1] = h.name
      else
        slots = slots + h.slots
        lines[#lines + 1] = h.line
      end
    end
    local f = io.open(live_path, "w")
    if f then
      f:write(table.concat(lines, "\n"), "\n")
      f:close()
    end
    local other = asked_np / asked_dp    -- tensor x context x pipeline: kept
    return { slots = slots, gone = gone, other = other,
             n = math.min(asked_np, math.floor(slots / other) * other) }
  end

  -- SIGUSR1 (a scheduler's notice) goes on to the job, whose ranks save a checkpoint and
  -- stop with STOPPED (tetra.train.loop): not a failure, and not restarted.
  local host = require("tetra.host")
  host.catch_stop_signal()
  local restarts, previous, streak = 0, nil, 0
  local code
  while true do
    C.tt_launch_setenv("TETRA_RESTART_COUNT", tostring(restarts), 1)
    if o.min_np and hostfile then
      local live, why = live_hosts()
      if not live then
        say("%s", why)
        code = 1
        break
      end
      if #live.gone > 0 then
        say("%s did not answer through %s within %g s: left out of the hostfile",
            table.concat(live.gone, ", "), table.concat(agent, " "), o.probe_timeout)
      end
      set_flag(argv, HOSTFILE_FLAGS, live_path)
      local n, other = live.n, live.other
      if n < o.min_np or n < other then
        say("giving up: the hostfile %s has %d slots; the largest job that keeps " ..
            "tensor x context x pipeline parallelism (%d processes) whole has %d, below " ..
            "--min-np %d", hostfile, live.slots, other, n, o.min_np)
        code = 1
        break
      end
      if n ~= np then
        local new_dp = n / other
        if n < np then
          say("the hostfile %s has %d slots for a job of %d processes: continuing on %d " ..
              "(parallel.data_parallel_size %d -> %d)", hostfile, live.slots, asked_np, n, dp, new_dp)
        else
          say("the hostfile %s has %d slots: back to %d processes (parallel.data_parallel_size " ..
              "%d -> %d)", hostfile, live.slots, n, dp, new_dp)
        end
        np, dp = n, new_dp
        set_flag(argv, NP_FLAGS, tostring(np))
        put_set(argv, "parallel.data_parallel_size", tostring(dp))
      end
    end
    os.remove(status_path)
    local pid, spawn_err = spawn(argv)
    if not pid then
      say("cannot run %s: %s", argv[1], spawn_err)
      code = 127
      break
    end
    -- While the job runs short of the processes it asked for, look for the hosts left
    -- out; when a larger job fits, stop this one at its next checkpoint.
    local can_grow = o.min_np and hostfile and o.grow_every > 0 and ckpt_dir
    local status, grow_to
    local next_probe = os.time() + o.grow_every
    while true do
      status, spawn_err = wait_for(pid, true)
      if status ~= false then break end
      if host.stop_requested(true) then C.tt_launch_kill(pid, SIGUSR1) end
      sleep_s(0.2)
      if can_grow and np < asked_np and os.time() >= next_probe then
        local live = live_hosts()
        next_probe = os.time() + o.grow_every
        if live and live.n > np then
          local before = latest_of(ckpt_dir)
          say("the hostfile %s has %d slots again: growing to %d processes at the job's " ..
              "next checkpoint", hostfile, live.slots, live.n)
          local deadline = os.time() + o.grow_wait
          while latest_of(ckpt_dir) == before and os.time() < deadline do
            status = wait_for(pid, true)
            if status ~= false then break end
            sleep_s(0.1)
          end
          if status == false then
            C.tt_launch_kill(pid, 15)
            status, spawn_err = wait_for(pid)
            grow_to = live.n
          end
          break
        end
      end
    end
    if not status then
      say("cannot wait for %s: %s", argv[1], spawn_err)
      code = 1
      break
    end
    if grow_to then
      restarts = restarts + 1
      say("restart %d: growing back to %d processes; resuming from the latest checkpoint",
          restarts, grow_to)
      put_set(argv, "checkpoint.resume", "auto")
      previous, streak = nil, 0
      goto continue
    end
    if status == STOPPED then
      say("the job stopped at SIGUSR1 after saving a checkpoint: not restarted (the " ..
          "command with --set checkpoint.resume=auto continues it)")
      code = STOPPED
      break
    end
    if status == 0 then
      if restarts > 0 then say("the job finished after %d restart%s", restarts, restarts == 1 and "" or "s") end
      code = 0
      break
    end
    local step = last_step(status_path)
    local failure = { status = status, step = step }
    local cause = describe(status, step)
    if previous and status < 128 and previous.status == status and previous.step == step then
      say("giving up: the job failed twice the same way (%s): a deterministic failure, " ..
          "a restart would fail again", cause)
      code = status
      break
    end
    if restarts >= o.max_restarts then
      say("giving up after %d restart%s: the job failed (%s)", restarts,
          restarts == 1 and "" or "s", cause)
      code = status
      break
    end
    -- The wait doubles while the job makes no progress between failures.
    local progressed = previous and step and (not previous.step or step > previous.step)
    streak = progressed and 1 or streak + 1
    previous = failure
    restarts = restarts + 1
    local wait = math.min(60, o.backoff * 2 ^ (streak - 1))
    say("restart %d: the job failed (%s); resuming from the latest checkpoint in %.1f s",
        restarts, cause, wait)
    put_set(argv, "checkpoint.resume", "auto")
    sleep_s(wait)
    ::continue::
  end
  if own_status then os.remove(status_path) end
  os.remove(status_path .. ".tmp")   -- left by a rank 0 killed while writing the step
  os.remove(live_path)
  return code
end

return M
