#!/bin/bash
# tetra test: counts, failure details, exit status, directories.
TETRA=${1:?usage: test_runner.sh /path/to/tetra}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

cat >"$tmp/mixed_spec.lua" <<'LUA'
describe("arith", function()
  it("adds", function() expect(1 + 1).to_be(2) end)
  it("is near", function() expect(0.1 + 0.2).to_be_near(0.3, 1e-12) end)
  it("fails on purpose", function() expect(2 * 2).to_be(5) end)
  describe("nested", function()
    local x
    before_each(function() x = 10 end)
    it("sees before_each", function() expect(x).to_be(10) end)
    it("raises", function() error("thrown inside") end)
  end)
end)
LUA
cat >"$tmp/good_spec.lua" <<'LUA'
it("passes", function() expect({ a = { 1, 2 } }).to_equal({ a = { 1, 2 } }) end)
LUA
echo 'this is not lua' >"$tmp/broken_spec.lua"

out=$("$TETRA" test "$tmp/mixed_spec.lua"); rc=$?
[ $rc -eq 1 ] || fail "failing specs exited $rc, expected 1"
[ "$(tail -n 1 <<<"$out")" = "3 passed, 2 failed" ] || fail "summary was '$(tail -n 1 <<<"$out")'"
grep -q "FAIL .*mixed_spec.lua: arith > fails on purpose" <<<"$out" || fail "failure not named: $out"
grep -q "mixed_spec.lua:4: expected 4 to be 5" <<<"$out" || fail "failure location/message missing: $out"
grep -q "arith > nested > raises" <<<"$out" || fail "nested failure not named"
grep -q "thrown inside" <<<"$out" || fail "error message missing"

out=$("$TETRA" test "$tmp/good_spec.lua"); rc=$?
[ $rc -eq 0 ] || fail "passing spec exited $rc"
[ "$out" = "1 passed, 0 failed" ] || fail "passing output was '$out'"

# A directory runs every *_spec.lua in it; a broken file counts as a failure.
out=$("$TETRA" test "$tmp"); rc=$?
[ $rc -eq 1 ] || fail "directory run exited $rc"
[ "$(tail -n 1 <<<"$out")" = "4 passed, 3 failed" ] || fail "directory summary was '$(tail -n 1 <<<"$out")'"
grep -q "broken_spec.lua" <<<"$out" || fail "broken file not reported"

out=$("$TETRA" test "$tmp/missing_spec.lua"); rc=$?
[ $rc -eq 1 ] || fail "missing file exited $rc"
[ "$(tail -n 1 <<<"$out")" = "0 passed, 1 failed" ] || fail "missing file summary '$(tail -n 1 <<<"$out")'"

[ $fails -eq 0 ] && echo "test_runner: all checks passed"
exit $((fails > 0))
