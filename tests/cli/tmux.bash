# Sourced by the REPL's terminal tests (repl_tty.sh, repl_mpi.sh): drives a command in a
# real terminal, a detached tmux session on a private server, by keystrokes.
#   tmux_start COMMAND          runs COMMAND in a new 200x50 terminal; "EXITED rc=N" is
#                               printed when it ends
#   keys KEY...                 tmux send-keys (text, Enter, Tab, C-c, C-d ...)
#   wait_for REGEX [SECONDS]    until a line of the whole scrollback matches (grep -E)
#   count REGEX                 how many lines of the scrollback match
#   fail MESSAGE                records a failure (the script exits 1 at the end)
# Without tmux the script is skipped (exit 77), except under CI=true, where that fails.
if ! command -v tmux >/dev/null; then
  [ "${CI:-}" = true ] && { echo "FAIL: no tmux (CI=true; tools/setup installs it)"; exit 1; }
  echo "skipped: no tmux"; exit 77
fi
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmux_sock="tetra-test-$$"
trap 'tmux -L "$tmux_sock" kill-server 2>/dev/null' EXIT
tmux_start() {
  # remain-on-exit keeps the terminal readable when a signal ends the shell too.
  tmux -L "$tmux_sock" -f /dev/null start-server \; set-option -g remain-on-exit on \; \
    set-option -g history-limit 100000 \; new-session -d -s t -x 200 -y 50 \
    "$1; echo EXITED rc=\$?; sleep 600" || { echo "FAIL: cannot start tmux"; exit 1; }
}
keys() { tmux -L "$tmux_sock" send-keys -t t "$@"; }
screen() { tmux -L "$tmux_sock" capture-pane -p -J -S - -t t; }
count() { screen | grep -cE "$1"; }
wait_for() {
  local deadline=$((SECONDS + ${2:-30}))
  while [ $SECONDS -lt $deadline ]; do
    screen | grep -qE "$1" && return 0
    # The command ended: what is awaited will not come (fail now, not at the deadline).
    [[ "$1" != *EXITED* ]] && screen | grep -qE '^EXITED|^Pane is dead' && break
    sleep 0.2
  done
  fail "timed out waiting for /$1/; the terminal shows:"
  screen | grep -v '^$' | tail -40
  return 1
}
# The session's prompt count grows by one per line read; waiting for the next one is how a
# test knows a command has finished.
prompts() { screen | grep -cE '^tetra> '; }
wait_prompt() {   # wait_prompt N: until at least N prompts were shown
  local deadline=$((SECONDS + ${2:-30}))
  while [ $SECONDS -lt $deadline ]; do
    [ "$(prompts)" -ge "$1" ] && return 0
    screen | grep -qE '^EXITED|^Pane is dead' && break
    sleep 0.2
  done
  fail "timed out waiting for prompt $1"
  screen | grep -v '^$' | tail -40
  return 1
}
