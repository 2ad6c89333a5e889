#!/bin/bash
# Config errors from `tetra run`: printed once, naming the key and the fix, before
# anything runs.
TETRA=${1:?usage: config.sh /path/to/tetra}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

check_error() {  # expected-substring args...
  local want=$1; shift
  local err; err=$(env -u OMPI_COMM_WORLD_SIZE "$TETRA" run "$@" 2>&1 >/dev/null); local rc=$?
  [ $rc -ne 0 ] || fail "tetra run $* succeeded"
  [ "$(wc -l <<<"$err")" -eq 1 ] || fail "tetra run $*: expected one line, got: $err"
  grep -qF -- "$want" <<<"$err" || fail "tetra run $*: expected '$want', got: $err"
}

# (The guide's YAML names what else it misses on more lines: tests/cli/guide_yaml.sh.)
check_error "config error: this layout needs 2 processes (data 2 x tensor 1 x pipeline 1 x context 1) but 1 is running" \
  "$SRC/recipes/configs/tiny.yaml" --set parallel.data_parallel_size=2
check_error "config error: unknown key 'train.batchsize' (did you mean 'train.batch_size'?)" \
  "$SRC/recipes/configs/tiny.yaml" --set train.batchsize=8
check_error "config error: model.n_kv_heads (3) must divide model.n_heads (4)" \
  "$SRC/recipes/configs/tiny.yaml" --set model.n_kv_heads=3
check_error "config error: train.precision must be one of fp32, bf16, fp16, fp8" \
  "$SRC/recipes/configs/tiny.yaml" --set train.precision=fp64

# Under mpirun only rank 0 prints it.
err=$(OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=4 "$TETRA" run "$SRC/recipes/configs/llama-7b.yaml" 2>&1); rc=$?
[ $rc -ne 0 ] || fail "rank 3 succeeded"
[ -z "$err" ] || fail "rank 3 printed: $err"
err=$(OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=4 "$TETRA" run "$SRC/recipes/configs/llama-7b.yaml" 2>&1)
grep -qF "but 4 are running" <<<"$err" || fail "rank 0 message: $err"

# A Lua script that is not a recipe just runs.
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo 'print("script ran", arg[0] ~= nil)' >"$tmp/script.lua"
out=$("$TETRA" run "$tmp/script.lua"); [ "$out" = "$(printf 'script ran\ttrue')" ] || fail "script printed '$out'"

[ $fails -eq 0 ] && echo "config: all checks passed"
exit $((fails > 0))
