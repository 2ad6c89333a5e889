#!/usr/bin/env bash
# tools/cached-venv, which tools/test's set-up runs for the Python references: a fresh
# checkout reuses the environment its lock made (nothing installed again), a changed lock,
# interpreter flags or a half-made environment make a new one, a lock with an unpinned
# line or a cache it cannot write is refused, environments unused for 30 days are removed
# (only of their own kind), and a directory an older set-up left at the link's place
# becomes the link. The locks here name no package and the environments have no pip
# (--without-pip), so no network is needed and each takes a fraction of a second.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tool=$root/tools/cached-venv
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
export TETRA_CACHE_DIR=$tmp/cache
command -v python3 > /dev/null || { echo "SKIP: no python3"; exit 77; }
python3 -c 'import venv, ensurepip' 2> /dev/null ||
  { echo "SKIP: python3 has no venv/ensurepip (tools/setup installs python3-venv)"; exit 77; }

printf '# no packages: the environment alone\n' > "$tmp/lock.txt"
mk() { "$tool" "$@" > "$tmp/out" 2>&1; }

# An unpinned line is refused, naming the file and the line, and nothing is made.
printf 'numpy>=1.20\n' > "$tmp/bad.txt"
if mk "$tmp/a/venv" python3 "$tmp/bad.txt" --without-pip; then fail "a lock with 'numpy>=1.20' was accepted"; fi
grep -q "bad.txt: every line must be name==version; not: numpy>=1.20" "$tmp/out" ||
  fail "the refusal did not name the file and line: $(cat "$tmp/out")"
[ ! -e "$tmp/a/venv" ] || fail "a refused lock left $tmp/a/venv"

# A cache it cannot write (even root cannot make a directory in /proc): one line that
# names it and the fix.
if TETRA_CACHE_DIR=/proc/tetra-cache mk "$tmp/a/venv" python3 "$tmp/lock.txt" --without-pip; then
  fail "an unwritable cache was accepted"
fi
[ "$(wc -l < "$tmp/out")" -eq 1 ] &&
  grep -q "cannot write /proc/tetra-cache: set TETRA_CACHE_DIR" "$tmp/out" ||
  fail "an unwritable cache: not one line naming it: $(cat "$tmp/out")"

# The first checkout makes it; the link is a working environment.
mk "$tmp/a/venv" python3 "$tmp/lock.txt" --without-pip || fail "making the environment: $(cat "$tmp/out")"
grep -q "making $TETRA_CACHE_DIR/venv-" "$tmp/out" || fail "first run did not make one: $(cat "$tmp/out")"
first=$(readlink "$tmp/a/venv")
[ -L "$tmp/a/venv" ] && [ -f "$first/.tetra-complete" ] || fail "no link to a complete environment"
prefix=$("$tmp/a/venv/bin/python3" -c 'import sys; print(sys.prefix != sys.base_prefix)')
[ "$prefix" = True ] || fail "the link's python3 is not in a virtual environment"

# A second checkout reuses it: the same directory, with what it held.
touch "$first/sentinel"
mk "$tmp/b/venv" python3 "$tmp/lock.txt" --without-pip || fail "second checkout: $(cat "$tmp/out")"
grep -q "reusing $first" "$tmp/out" || fail "second checkout did not reuse: $(cat "$tmp/out")"
[ "$(readlink "$tmp/b/venv")" = "$first" ] && [ -e "$first/sentinel" ] ||
  fail "second checkout's link is $(readlink "$tmp/b/venv"), not the first environment"

# Half made (no .tetra-complete): made again in place.
rm "$first/.tetra-complete"
mk "$tmp/b/venv" python3 "$tmp/lock.txt" --without-pip || fail "remaking: $(cat "$tmp/out")"
grep -q "making $first" "$tmp/out" && [ ! -e "$first/sentinel" ] && [ -f "$first/.tetra-complete" ] ||
  fail "a half-made environment was reused: $(cat "$tmp/out")"

# A changed lock, or other venv flags, make another environment.
printf '# no packages, changed\n' > "$tmp/lock2.txt"
mk "$tmp/c/venv" python3 "$tmp/lock2.txt" --without-pip || fail "changed lock: $(cat "$tmp/out")"
second=$(readlink "$tmp/c/venv")
[ -n "$second" ] && [ "$second" != "$first" ] || fail "a changed lock reused $first"
mk "$tmp/d/venv" python3 "$tmp/lock.txt" --without-pip --system-site-packages || fail "flags: $(cat "$tmp/out")"
third=$(readlink "$tmp/d/venv")
[ -n "$third" ] && [ "$third" != "$first" ] && [ "$third" != "$second" ] ||
  fail "--system-site-packages reused an environment made without it"
grep -q 'include-system-site-packages = true' "$third/pyvenv.cfg" ||
  fail "the flags did not reach python -m venv"

# Unused for 30 days: removed when one of its kind is set up; another kind's is kept.
mkdir -p "$TETRA_CACHE_DIR/venv-hf-0123456789abcdef"
touch -d '40 days ago' "$TETRA_CACHE_DIR/venv-hf-0123456789abcdef/.tetra-complete" "$second/.tetra-complete"
mk "$tmp/a/venv" python3 "$tmp/lock.txt" --without-pip || fail "pruning run: $(cat "$tmp/out")"
[ ! -e "$second" ] || fail "an environment unused for 40 days was kept"
[ -e "$first" ] && [ -e "$third" ] || fail "an environment in use was removed"
[ -e "$TETRA_CACHE_DIR/venv-hf-0123456789abcdef" ] ||
  fail "setting up venv removed an environment of another kind (venv-hf)"

# A directory left at the link's place by an older set-up becomes the link.
mkdir -p "$tmp/e/venv/bin"
mk "$tmp/e/venv" python3 "$tmp/lock.txt" --without-pip || fail "old layout: $(cat "$tmp/out")"
[ -L "$tmp/e/venv" ] && [ "$(readlink "$tmp/e/venv")" = "$first" ] ||
  fail "the old directory was not replaced by the link"

[ "$fails" -eq 0 ] && echo "cached_venv: all checks passed"
exit $((fails > 0))
