#!/bin/bash
# Bad usage exits 2 with one line on stderr; --help and --version exit 0.
TETRA=${1:?usage: usage.sh /path/to/tetra}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

expect_usage() {  # args...: must exit 2 with exactly one stderr line and no stdout
  "$TETRA" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [ $rc -eq 2 ] || fail "tetra $* exited $rc, expected 2"
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "tetra $*: stderr is not one line: $(cat "$tmp/err")"
  [ -s "$tmp/out" ] && fail "tetra $*: unexpected stdout: $(cat "$tmp/out")"
  grep -q '^tetra: ' "$tmp/err" || fail "tetra $*: message lacks the 'tetra: ' prefix"
}

expect_usage bogus
expect_usage --bogus
expect_usage run
expect_usage run --set a.b=1
expect_usage run recipe.lua extra
expect_usage run recipe.lua --set
expect_usage run recipe.lua --set novalue
expect_usage run recipe.lua --set =1
expect_usage test
expect_usage -e
grep -q "unknown command 'bogus'" <("$TETRA" bogus 2>&1) || fail "unknown command not named"

out=$("$TETRA" --version); rc=$?
[ $rc -eq 0 ] || fail "--version exited $rc"
[[ "$out" =~ ^tetra\ [0-9]+\.[0-9]+\.[0-9]+ ]] || fail "--version printed '$out'"

out=$("$TETRA" --help); rc=$?
[ $rc -eq 0 ] || fail "--help exited $rc"
for word in "tetra run FILE" "tetra -i FILE" "tetra -e CODE" "tetra test PATH" "--set"; do
  grep -qF -- "$word" <<<"$out" || fail "--help does not mention '$word'"
done

[ $fails -eq 0 ] && echo "usage: all checks passed"
exit $((fails > 0))
