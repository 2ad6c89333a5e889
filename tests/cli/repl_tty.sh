#!/bin/bash
# The REPL in a real terminal (tmux): Ctrl-C stops train_steps between two steps and the
# session goes on with its state; Ctrl-C at the prompt drops the line and does not exit;
# Ctrl-C stops a plain Lua loop; `t = ...; t` prints t at once; Tab completes config keys
# and module methods; Ctrl-D leaves with status 0.
TETRA=${1:?usage: repl_tty.sh /path/to/tetra}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$SRC/tests/cli/tmux.bash"

tmux_start "cd '$SRC' && TETRA_HISTORY= OMP_NUM_THREADS=1 '$TETRA' -i recipes/tiny.lua"
wait_for '^tetra> ' 30 || exit 1

# Ctrl-C in a long train_steps: the loop stops after a whole step, the model keeps it.
keys 'train_steps(100000)' Enter
wait_for '^step 3 ' 30
keys C-c
# The checks below type into the session and need the loop stopped: a Ctrl-C that did
# not stop it fails here (each later wait would only run out its time).
wait_for 'interrupted \(Ctrl-C\) after [0-9]+ of 100000 steps$' 30 || exit 1
done_steps=$(screen | sed -nE 's/.*interrupted \(Ctrl-C\) after ([0-9]+) of 100000 steps$/\1/p')
wait_prompt 2
keys 'train_steps(1)' Enter
wait_for "^step $((done_steps + 1)) +loss" 30 || fail "the next step is not $((done_steps + 1))"
wait_prompt 3

# Ctrl-C at the prompt: the typed text is dropped, the session stays.
keys 'zz = 12'
sleep 0.5
keys C-c
wait_prompt 4
keys 'zz == nil and "line dropped" or "line ran"' Enter
wait_for '^line dropped$' 10
wait_prompt 5

# A statement then an expression is complete: the expression prints, nothing is swallowed.
keys 't = tetra.ones({2, 3}) * 2; t' Enter
wait_for '^tensor\(f32\[2, 3\] cpu\)$' 10
wait_prompt 6
keys '"next line runs"' Enter
wait_for '^next line runs$' 10
wait_prompt 7

# Tab: a config key (cfg.model.vocab_ -> vocab_size) and a module method.
keys 'cfg.model.vocab_' Tab
sleep 0.5
keys Enter
wait_for '^256$' 10 || fail "cfg.model.vocab_<Tab> did not complete to vocab_size"
wait_prompt 8
keys 'tostring(model:num_par' Tab
sleep 0.5
keys '() > 0) .. "-method"' Enter
wait_for '^true-method$' 10 || fail "model:num_par<Tab> did not complete to num_params"
wait_prompt 9

# Ctrl-C stops plain Lua code too.
keys 'while true do end' Enter
sleep 1
keys C-c
wait_for 'error: interrupted \(Ctrl-C\)$' 10
wait_prompt 10

[ "$(count '^EXITED')" -eq 0 ] || fail "the session ended before Ctrl-D"
keys C-d
wait_for '^EXITED rc=0$' 10 || fail "Ctrl-D did not leave with status 0"

[ $fails -eq 0 ] && echo "repl_tty: all checks passed"
exit $((fails > 0))
