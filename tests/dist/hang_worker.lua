-- Worker for kill_rank.sh: every rank all-reduces in a loop; at step 10 rank 2 stops
-- (SIGSTOP: a hung process) or dies (SIGKILL), chosen by TT_HANG_SIGNAL. The others must
-- not hang: the watchdog (dist.timeout_s from TT_TIMEOUT) reports and aborts the job.
-- TT_HANG_AT=comm_split: at step 10 the others make a group instead (MPI_Comm_split, a call
-- that blocks and cannot poll), which only the watchdog thread can see.
local ffi = require("ffi")
local tetra = require("tetra")
local dist = tetra.dist

ffi.cdef("int kill(int pid, int sig); int getpid(void);")
local signals = { STOP = 19, KILL = 9 }
local sig = signals[os.getenv("TT_HANG_SIGNAL") or "STOP"]
local at_split = os.getenv("TT_HANG_AT") == "comm_split"
local mesh = dist.init({ parallel = { data_parallel_size = dist.world_size() },
                         dist = { timeout_s = tonumber(os.getenv("TT_TIMEOUT") or "5") } })
local t = tetra.zeros(4096)
for step = 1, 100000 do
  dist.set_step(step)
  if step == 10 and mesh.rank == 2 then ffi.C.kill(ffi.C.getpid(), sig) end
  if step == 10 and at_split then mesh.dp:split(0, mesh.rank, "late") end
  mesh.dp:all_reduce(t, "sum")
end
