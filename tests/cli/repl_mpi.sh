#!/bin/bash
# The SPMD REPL in a real terminal (tmux) under `mpirun -np 4`, tiny Llama with tp=2 x
# dp=2: rank 0 takes the terminal; a line runs on every rank and identical answers come
# back once with their ranks; %on chooses ranks (by number and by mesh coordinate); an
# error on one rank names it and the session goes on; Ctrl-C in train_steps(1000) stops
# every rank after the same step and the next step follows it; a tensor-parallel shard
# prints with its placement and full() gathers the whole parameter; Ctrl-C reaches ranks
# running a line that rank 0 does not run; Tab completes on rank 0's terminal.
TETRA=${1:?usage: repl_mpi.sh /path/to/tetra}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$SRC/tests/cli/tmux.bash"
if ! command -v mpirun >/dev/null; then
  [ "${CI:-}" = true ] && { echo "FAIL: no mpirun (CI=true)"; exit 1; }
  echo "skipped: no mpirun"; exit 77
fi
# Open MPI keeps allocations past MPI_Finalize: a sanitizer build checks these ranks for
# memory errors, not leaks (as tests/dist does). tmux passes the environment on.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

tmux_start "cd '$SRC' && TETRA_HISTORY= OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 \
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 4 '$TETRA' -i recipes/tiny.lua \
--set parallel.tensor_parallel_size=2 --set parallel.data_parallel_size=2"
wait_for '4 ranks: lines run on all' 60 || exit 1
wait_prompt 1

# One line, every rank: identical answers grouped, different ones per rank.
keys 'cfg.model.dim' Enter
wait_for '^\[0-3\] 64$' 20
wait_prompt 2
keys '"r" .. rank' Enter
wait_for '^\[3\] r3$' 20
[ "$(count '^\[[0-3]\] r[0-3]$')" -eq 4 ] || fail "each rank's own answer should show once"
wait_prompt 3

# probe() and inspect() on a tensor-parallel model: one forward and backward through the
# layout's own step strategy, the loss agreed by all ranks, each rank's shard gradients.
keys 'probe()' Enter
wait_for '^\[0-3\] loss [0-9.]+ on 8 x 32 tokens; gradients kept' 30
wait_prompt 4
keys 'inspect(model.layers[1].attention)' Enter
wait_for '^\[[0-3,]+\]   wq\.weight +\[32, 64\] +norm [0-9.]+ +grad norm [0-9]' 20
wait_prompt 5

# Selections: by rank number, by mesh coordinate (tp fastest: dp=1 is ranks 2 and 3).
keys '%on 1,3' Enter
wait_for '^lines run on ranks 1,3$' 20
keys '"s" .. rank' Enter
wait_for '^\[3\] s3$' 20
[ "$(count '^\[[0-3]\] s')" -eq 2 ] || fail "%on 1,3 ran on other ranks: $(screen | grep '\] s')"
wait_prompt 7
keys '%on dp=1' Enter
wait_for '^lines run on ranks 2-3$' 20
keys '"d" .. rank' Enter
wait_for '^\[3\] d3$' 20
[ "$(count '^\[[0-3]\] d')" -eq 2 ] || fail "%on dp=1 ran on other ranks"
wait_prompt 9
keys '%on all' Enter
wait_for '^lines run on ranks 0-3$' 20
wait_prompt 10

# An error on one rank: named, the other ranks answer, the session goes on.
keys 'if rank == 2 then error("boom") end; return "fine"' Enter
wait_for '^\[2\] error: stdin:1: boom$' 20
wait_for '^\[0-1,3\] fine$' 20
wait_prompt 11

# Ctrl-C during train_steps(1000): every rank stops after the same step.
keys 'train_steps(1000)' Enter
sleep 1.5
keys C-c
wait_for '^\[0-3\] interrupted \(Ctrl-C\) after [0-9]+ of 1000 steps$' 60
n=$(screen | sed -nE 's/^\[0-3\] interrupted \(Ctrl-C\) after ([0-9]+) of 1000 steps$/\1/p')
wait_prompt 12
keys 'train_steps(1)' Enter
wait_for "^\[0-3\] step $((n + 1)) +loss" 30 || fail "the step after the interrupt is not $((n + 1))"
wait_prompt 13

# A shard prints with its placement; full() gathers it (the same whole on every rank,
# holding this rank's rows where its placement says).
keys 'w = model.layers[1].attention.wq.weight; w' Enter
wait_for '^\[0,2\] shard of layers\.0\.attention\.wq\.weight \[64, 64\]: dim 0, \[0, 32\) of 64$' 20
wait_for '^\[1,3\] shard of layers\.0\.attention\.wq\.weight \[64, 64\]: dim 0, \[32, 64\) of 64$' 20
wait_prompt 14
keys 'g = full(w); d = g:narrow(0, 32 * mesh.coords.tp, 32) - w' Enter
wait_prompt 15
keys '("%d %g %.6f"):format(g:size(0), (d * d):sum():item(), g:sum():item())' Enter
wait_for '^\[0-3\] 64 0 -?[0-9]+\.[0-9]+$' 20 || fail "full(w) differs between ranks or from w"
wait_prompt 16

# Ctrl-C while rank 0 only waits (it is not among the ranks running the line): it
# reaches ranks 1-3 as rank 0's token, and they agree on it at interrupted().
keys '%on 1-3' Enter
wait_for '^lines run on ranks 1-3$' 20
keys 'n = 0; while not interrupted() do n = n + 1 end; return "stopped"' Enter
sleep 2
keys C-c
wait_for '^\[1-3\] stopped$' 30 || fail "Ctrl-C did not reach ranks 1-3 while rank 0 waited"
wait_prompt 18
keys '%on all' Enter
wait_for '^lines run on ranks 0-3$' 20

# Tab on rank 0's terminal.
keys 'cfg.model.vocab_' Tab
sleep 0.5
keys Enter
wait_for '^\[0-3\] 256$' 20 || fail "cfg.model.vocab_<Tab> did not complete under mpirun"
wait_prompt 20

[ "$(count '^EXITED')" -eq 0 ] || fail "the session ended before Ctrl-D"
keys C-d
wait_for '^EXITED rc=0$' 30 || fail "Ctrl-D did not end every rank with status 0"

# A line with no safe point cannot be stopped in place under mpirun: the third Ctrl-C
# ends the job instead of leaving the terminal stuck.
tmux -L "$tmux_sock" kill-server 2>/dev/null
tmux_sock="$tmux_sock-2"   # a server of its own: the first one may still be shutting down
tmux_start "cd '$SRC' && TETRA_HISTORY= OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 \
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 '$TETRA'"
wait_for '2 ranks: lines run on all' 60
keys 'while true do end' Enter
sleep 1
for _ in 1 2 3; do keys C-c; sleep 0.3; done
wait_for 'Ctrl-C three times and no safe point reached' 20
wait_for '^EXITED rc=[1-9]' 30 || fail "the job did not end after the third Ctrl-C"

[ $fails -eq 0 ] && echo "repl_mpi: all checks passed"
exit $((fails > 0))
