#!/bin/bash
# tetra -e: runs Lua with the library on package.path, passes arguments, reports errors.
TETRA=${1:?usage: eval.sh /path/to/tetra}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

out=$("$TETRA" -e 'print(1 + 1)'); [ "$out" = "2" ] || fail "-e printed '$out'"
out=$("$TETRA" -e 'print(arg[0], arg[1], arg[2], #arg)' foo bar)
[ "$out" = "$(printf -- '-e\tfoo\tbar\t2')" ] || fail "arg table was '$out'"
# The library loads and computes: sum of 0..9 through an engine tensor.
out=$("$TETRA" -e 'local t = require("tetra"); print(t.arange(0, 10, 1, "f32"):sum():item())')
[ "$out" = "45" ] || fail "tensor sum printed '$out'"

err=$("$TETRA" -e 'error("kaboom")' 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] || fail "a Lua error exited $rc, expected 1"
grep -q "kaboom" <<<"$err" || fail "error message missing: $err"
grep -q "stack traceback" <<<"$err" || fail "no traceback for a runtime error: $err"

err=$("$TETRA" -e 'this is not lua' 2>&1); rc=$?
[ $rc -eq 1 ] || fail "a syntax error exited $rc, expected 1"
grep -q "(command line)" <<<"$err" || fail "syntax error does not name the chunk: $err"

# Engine errors point at the user's line.
err=$("$TETRA" -e 'local t = require("tetra")
local a, b = t.zeros(2, 3), t.zeros(4, 5)
local c = a:matmul(b)' 2>&1)
grep -q "(command line):3:" <<<"$err" || fail "engine error not at the caller's line: $err"

[ $fails -eq 0 ] && echo "eval: all checks passed"
exit $((fails > 0))
