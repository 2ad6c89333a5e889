#!/bin/bash
# tetra plan --cluster cpu prices layouts with this machine's rates
# (lua/tetra/planner/local_cpu.lua): measured the first time (the engine's GEMM and copy
# on one thread, an all-reduce between 2 ranks under mpirun) and cached per machine;
# the cache is what later runs use (a doctored cache moves the prediction); --measure
# measures again, --preset-rates takes the preset's figures.
TETRA=${1:?usage: plan_rates.sh /path/to/tetra}
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TETRA_CACHE_DIR="$work/cache"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
args=(--set model.dim=256 --set model.n_layers=4 --batch 8 --top 1)
tokens() { awk '$1 == "1" { print $(NF - 2) }' "$1"; }

"$TETRA" plan "${args[@]}" >"$work/first" 2>"$work/first.err" || fail "first plan: $(cat "$work/first.err")"
grep -q "measuring this machine's rates" "$work/first.err" || fail "the first run did not measure"
grep -q "^# cpu rates measured here [0-9-]* [0-9:]* UTC: GEMM [0-9.]* GFLOP/s a core, copy [0-9.]* GB/s, all-reduce [0-9]* us + [0-9.]* GB/s$" "$work/first" ||
  fail "no measured rates line: $(head -2 "$work/first")"
grep -q "^# this machine: .*, [0-9]* cores, one rank per core" "$work/first" ||
  fail "the cluster is not this machine's: $(sed -n 2p "$work/first")"
[ -f "$work/cache/cpu-rates.lua" ] || fail "no cache written"
gflops=$(sed -n 's/.*GEMM \([0-9.]*\) GFLOP.*/\1/p' "$work/first")
awk -v g="$gflops" 'BEGIN { exit !(g > 1 && g < 10000) }' || fail "a GEMM rate of $gflops GFLOP/s"

"$TETRA" plan "${args[@]}" >"$work/second" 2>"$work/second.err" || fail "second plan"
grep -q "measuring" "$work/second.err" && fail "the second run measured again"
grep -q "(cached: $work/cache/cpu-rates.lua)" "$work/second" || fail "the second run names no cache"
[ "$(tokens "$work/first")" = "$(tokens "$work/second")" ] ||
  fail "cached rates predict $(tokens "$work/second") tokens/s, measured ones $(tokens "$work/first")"

# The cache is what prices: a GEMM rate 100 times lower predicts far fewer tokens/s.
sed -i -E 's/peak_flops = [0-9.e+-]+/peak_flops = 1e9/' "$work/cache/cpu-rates.lua"
"$TETRA" plan "${args[@]}" >"$work/slow" 2>/dev/null || fail "plan with the doctored cache"
awk -v a="$(tokens "$work/first")" -v b="$(tokens "$work/slow")" 'BEGIN { exit !(b < a / 5) }' ||
  fail "a 1 GFLOP/s cache predicts $(tokens "$work/slow") tokens/s against $(tokens "$work/first")"

# Each writer writes the cache under a name of its own and renames it over the old one:
# a name another writer could be using (here a directory in the way) does not stop it.
mkdir "$work/cache/cpu-rates.lua.tmp"
"$TETRA" plan "${args[@]}" --measure >"$work/again" 2>"$work/again.err" || fail "plan --measure"
grep -q "measuring this machine's rates" "$work/again.err" || fail "--measure did not measure"
# (Not against the first measurement: both are wall-clock rates, taken at different moments
# of a loaded machine.)
grep -q 'peak_flops = 1e9' "$work/cache/cpu-rates.lua" &&
  fail "--measure kept the doctored GEMM rate in the cache"
left=$(cd "$work/cache" && ls -A | grep -vx -e cpu-rates.lua -e cpu-rates.lua.tmp)
[ -z "$left" ] || fail "--measure left files beside the cache: $left"
awk -v a="$(tokens "$work/slow")" -v b="$(tokens "$work/again")" 'BEGIN { exit !(b > a) }' ||
  fail "--measure kept the doctored rates: $(tokens "$work/again") tokens/s, doctored $(tokens "$work/slow")"

# When the links cannot be measured (here an mpirun that fails, as one can on a loaded
# machine), the plan still prices with the measured GEMM and copy rates and the preset's
# links, and says why.
mkdir -p "$work/bin"
printf '#!/bin/sh\necho "mpirun: refused by the test" >&2\nexit 1\n' >"$work/bin/mpirun"
chmod +x "$work/bin/mpirun"
PATH="$work/bin:$PATH" "$TETRA" plan "${args[@]}" --measure >"$work/nolinks" 2>"$work/nolinks.err" ||
  fail "plan --measure without links: $(tail -n 3 "$work/nolinks.err")"
grep -q "the preset's links (mpirun gave no all-reduce times (mpirun: refused by the test))" "$work/nolinks" ||
  fail "plan --measure without links does not say why: $(sed -n 1p "$work/nolinks")"
grep -q 'links_note = "mpirun gave no all-reduce times' "$work/cache/cpu-rates.lua" ||
  fail "the cache does not keep why the links are the preset's"

"$TETRA" plan "${args[@]}" --preset-rates >"$work/preset" 2>&1 || fail "plan --preset-rates"
grep -q "cpu rates measured" "$work/preset" && fail "--preset-rates used measured rates"
grep -q "^# this machine: 2 CPU cores" "$work/preset" || fail "--preset-rates: not the preset"

[ $fails -eq 0 ] && echo "plan_rates: all checks passed"
exit $((fails > 0))
