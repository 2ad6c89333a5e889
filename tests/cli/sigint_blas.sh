#!/usr/bin/env bash
# Ctrl-C while the CPU's matmuls run must only set the REPL's flag. oneDNN's JIT GEMMs point
# rsp into the heap while they run; a signal frame pushed there corrupted malloc, and a
# Ctrl-C during train_steps killed the REPL now and then (cli/repl_tty, about 1 run in
# 8). The handler now runs on a stack of its own (engine/host/terminal.c). Here a process
# that caught interrupts as the REPL does runs the tiny model's GEMM shapes on oneDNN
# while this script sends it SIGINT without pause; it must finish and have seen them.
# Without the alternate stack it died in 3 runs of 3, after 7 to 57 signals.
# Usage: bash sigint_blas.sh /path/to/tetra
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
fail() { echo "FAIL: $*"; exit 1; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

# The shapes of recipes/tiny.lua's forward and backward (256 tokens, dim 64, ffn 128,
# vocab 256), each product twice (plain and transposed), until the deadline.
code='
local tetra, host = require("tetra"), require("tetra.host")
assert(host.catch_interrupts(), "catch_interrupts failed")
host.interrupt_lua(false)
local shapes = { {256, 64, 64}, {256, 128, 64}, {256, 64, 128}, {256, 256, 64} }
for _, s in ipairs(shapes) do   -- oneDNN generates its kernels before the signals start
  local a = tetra.randn({ s[1], s[3] })
  tetra.matmul(a, tetra.matmul(a, tetra.randn({ s[3], s[2] })), nil, true, false)
end
local ack = assert(io.open(arg[1] .. ".seen", "w"))   -- a byte per interrupt seen
io.open(arg[1], "w"):close()
local seen, products, stop = 0, 0, os.time() + tonumber(arg[2])
local function poll()
  if host.interrupted(true) then
    seen = seen + 1
    ack:write("x")
    ack:flush()
  end
end
while os.time() < stop do
  for _, s in ipairs(shapes) do
    local a, b = tetra.randn({ s[1], s[3] }), tetra.randn({ s[3], s[2] })
    local c = tetra.matmul(a, b)
    poll()
    local d = tetra.matmul(a, c, nil, true, false)
    poll()
    products = products + 2
  end
end
io.open(arg[1] .. ".done", "w"):close()   -- the signals stop here
print(("done products=%d interrupted=%d"):format(products, seen))
'
ready="$dir/ready"
TETRA_BLAS=onednn OMP_NUM_THREADS=1 "$tetra" -e "$code" "$ready" 8 >"$dir/out" 2>&1 &
pid=$!
for _ in $(seq 300); do [ -e "$ready" ] && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
[ -e "$ready" ] || { wait "$pid"; fail "the process did not start: $(cat "$dir/out")"; }
sent=0
# One signal a millisecond or so, each sent once the process has seen the last one (a
# byte in $ready.seen per interrupt its loop polled): never two unanswered, so they never
# pile up into the REPL's "three Ctrl-Cs and no safe point" exit. (Paced by the clock
# alone, a CI run under load once delivered three within one product and ended it.)
# Its loop ends by the clock after 8 s: one not done well after that is hung (a signal
# frame on the GEMM's stack can leave malloc's lock taken).
deadline=$((SECONDS + 40))
while [ ! -e "$ready.done" ]; do
  if [ $SECONDS -ge $deadline ]; then
    kill -KILL "$pid" 2>/dev/null
    fail "the process hung during SIGINTs in oneDNN GEMMs ($sent signals sent): $(tail -n 3 "$dir/out")"
  fi
  answered=$(stat -c %s "$ready.seen" 2>/dev/null || echo 0)
  if [ "$answered" -ge "$sent" ]; then
    kill -INT "$pid" 2>/dev/null || break
    sent=$((sent + 1))
  fi
  sleep 0.001
done
wait "$pid"
rc=$?
[ "$rc" -eq 0 ] || fail "SIGINT during oneDNN GEMMs ended the process (status $rc) after $sent signals: $(tail -n 3 "$dir/out")"
line="$(tail -n 1 "$dir/out")"
seen="$(sed -nE 's/^done products=[0-9]+ interrupted=([0-9]+)$/\1/p' <<<"$line")"
[ -n "$seen" ] || fail "unexpected output: $(cat "$dir/out")"
[ "$seen" -gt 0 ] || fail "no interrupt reached the flag ($sent sent): $line"
echo "PASS: $line, $sent signals sent"
