#!/usr/bin/env bash
# tests/gpu_check/report.sh — tools/gpu-check's reporting, without a GPU:
#  - `gpu-check summary` on canned log directories: the stage table, the exit status, and
#    the failures an exit status hides (ctest exiting 0 with CUDA tests "Not Run", no test
#    found, a benchmark without its figure); the figures still print after a failure.
#    The ctest logs in logs/ are real ctest 3.25 output (passes, skips, a failure, a
#    timeout, a missing program).
#  - the stage runner's budget: a stage is cut at the deadline (also one that ignores
#    SIGTERM), a stage the budget no longer reaches is "not-run", and no stage ends after
#    the deadline.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CHECK=$HERE/../../tools/gpu-check
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# canned DIR STAGE=STATUS... : a log directory in which every stage passed, then the
# given stages' status replaced (their logs stay as written below, or as the caller puts).
canned() {
  local d=$WORK/$1
  shift
  mkdir -p "$d"
  echo 470 > "$d/budget"
  echo "NVIDIA H200, 580.159.04, 143771 MiB" > "$d/gpu.log"
  echo "unpacked 94 packages into /root/tetra/build-gpu/deps-root" > "$d/unpack.log"
  printf -- '-- Configuring\n-- CUDA kernels for: 90a\n-- Generating done\n' > "$d/configure.log"
  echo "[100%] Built target gpu_bench" > "$d/build.log"
  echo "built: 3 CUDA tests, tetra, gpu_bench" > "$d/built.log"
  cp "$HERE/logs/ctest_passed.log" "$d/tests.log"
  printf 'bf16 GEMM 8192^3: 702.1 TFLOP/s (cuBLAS 710.3)\nLlama-7B layer: 41.2%% MFU\n' > "$d/bench.log"
  echo "attention (cuDNN via PyTorch 2.11.0, bf16) causal fwd+bwd T=4096 32x128: 2.10 ms, 392.6 TFLOP/s" > "$d/attention.log"
  echo "attention bf16 cuDNN    causal B=1 T=4096 32x128: fwd    1.10 ms  499.7 TFLOP/s, fwd+bwd    3.90 ms  422.9 TFLOP/s" > "$d/cudnn_attention.log"
  printf 'gpu_train: loss 10.4012 -> 10.3120, nonfinite=0 of 6 steps\ngpu_train: 6 steps, cuda, bf16: tokens_per_s=51234.5\n' > "$d/llama_1b.log"
  printf 'gpu_train: loss 10.4050 -> 10.3301, nonfinite=0 of 6 steps\ngpu_train: 6 steps, cuda, fp8: tokens_per_s=70123.4\n' > "$d/llama_1b_fp8.log"
  printf 'gpu_train: 61.2M parameters on cuda\ngraphs: eager 401234 tokens/s, graphs 612345 tokens/s, graphs/eager 1.53\n' > "$d/graphs.log"
  printf '========= ERROR SUMMARY: 0 errors\nmemcheck clean: 9 processes, 0 errors\n' > "$d/memcheck.log"
  local name
  : > "$d/stages.tsv"
  for name in gpu unpack configure build built tests bench attention cudnn_attention llama_1b \
              llama_1b_fp8 graphs memcheck; do
    local status=ok kv
    for kv in "$@"; do [ "${kv%%=*}" = "$name" ] && status=${kv#*=}; done
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" 10 100 >> "$d/stages.tsv"
  done
  echo "$d"
}

# expect DIR RC PATTERN...: `gpu-check summary DIR` exits RC and prints every pattern
# (grep -E), and summary.txt holds what it printed.
expect() {
  local d=$1 want_rc=$2
  shift 2
  local out rc=0
  out=$("$CHECK" summary "$d" 2>&1) || rc=$?
  [ "$rc" -eq "$want_rc" ] || fail "$(basename "$d"): exit $rc, wanted $want_rc; output:"$'\n'"$out"
  local p
  for p in "$@"; do
    grep -qE -- "$p" <<<"$out" || fail "$(basename "$d"): no line matching '$p' in:"$'\n'"$out"
  done
  [ "$out" = "$(cat "$d/summary.txt" 2>/dev/null)" ] || fail "$(basename "$d"): summary.txt differs from the printout"
}

# -- Summaries of canned runs -------------------------------------------------------------
d=$(canned pass)
expect "$d" 0 '^== gpu-check: PASS: every stage passed; NVIDIA H200, 580.159.04' \
  '^tests +ok +10 +4 tests: 4 passed, 0 failed, 0 not run$' '^configure +ok .*CUDA kernels for: 90a' \
  '^built +ok .*built: 3 CUDA tests' '^llama_1b +ok .*tokens_per_s=51234.5' \
  '^llama_1b_fp8 +ok .*tokens_per_s=70123.4' '^memcheck +ok .*memcheck clean: 9 processes' \
  '^-- bench --' 'Llama-7B layer: 41.2% MFU' '^attention +ok .*392.6 TFLOP/s' \
  '^cudnn_attention +ok .*bf16 cuDNN +causal B=1 T=4096.*422.9 TFLOP/s' '^-- cudnn_attention --' \
  '^graphs +ok .*eager 401234 tokens/s, graphs 612345 tokens/s, graphs/eager 1.53' '^-- graphs --'

d=$(canned graphs_missing)
echo "gpu_train: 61.2M parameters on cuda" > "$d/graphs.log"
expect "$d" 1 '^graphs +failed .*no graphs figure in the log'

d=$(canned cudnn_missing)
echo "attention_cuda: no usable cuDNN (see the line above)" > "$d/cudnn_attention.log"
expect "$d" 1 '^cudnn_attention +failed .*no cuDNN figure in the log'

d=$(canned excluded)
{ echo "excluded: cuda/multigpu_* (they need 4 GPUs; this machine has 1)"; cat "$HERE/logs/ctest_passed.log"; } > "$d/tests.log"
expect "$d" 0 '^tests +ok .*4 tests: 4 passed, 0 failed, 0 not run; cuda/multigpu_\* left out \(fewer than 4 GPUs\)'

# ctest exits 0 while the CUDA tests skip: what once read "100% tests passed".
d=$(canned skipped)
cp "$HERE/logs/ctest_skipped.log" "$d/tests.log"
expect "$d" 1 '^== gpu-check: FAIL: tests;' \
  '^tests +failed .*3 tests: 1 passed, 0 failed, 2 not run: cuda/test_kernels \(Skipped\), cuda/test_lowp \(Skipped\)' \
  '^-- bench --' 'Llama-7B layer: 41.2% MFU' 'tokens_per_s=51234.5'

d=$(canned failures "tests=failed (rc 8)")
cp "$HERE/logs/ctest_failures.log" "$d/tests.log"
expect "$d" 1 '^== gpu-check: FAIL: tests;' \
  '^tests +failed \(rc 8\) .*5 tests: 1 passed, 3 failed, 1 not run: cuda/gpu_bf16 \(Timeout\), cuda/test_kernels \(Skipped\), cuda/test_lowp \(Failed\), cuda/test_missing \(Not Run\)' \
  '^-- tests \(last lines of .*tests.log\) --' 'cuda/test_missing \(Not Run\)' 'Llama-7B layer: 41.2% MFU'

d=$(canned none)
cp "$HERE/logs/ctest_none.log" "$d/tests.log"
expect "$d" 1 '^tests +failed .*ctest found no tests'

d=$(canned truncated)
head -5 "$HERE/logs/ctest_passed.log" > "$d/tests.log"
expect "$d" 1 '^tests +failed .*ctest printed no result line'

# The build ran out of its time; later stages never ran.
d=$(canned timeout build=timeout built=not-run tests=not-run bench=not-run attention=not-run llama_1b=not-run llama_1b_fp8=not-run memcheck=not-run)
rm -f "$d"/{built,tests,bench,attention,llama_1b,llama_1b_fp8,memcheck}.log
expect "$d" 1 '^build +timeout .*stopped after its 100 s limit' '^tests +not-run .*the budget was spent' \
  '^== gpu-check: FAIL: build built tests bench attention llama_1b llama_1b_fp8 memcheck;'

# Exit 0 but no figure, a missing log, and a GPU machine where nvidia-smi failed.
d=$(canned nofigure "gpu=failed (rc 9)")
echo "lua error: out of memory" > "$d/llama_1b.log"
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver" > "$d/gpu.log"
echo "device: NVIDIA H200; dense bf16 peak taken as 989 TFLOP/s" > "$d/bench.log"
rm "$d/attention.log"
expect "$d" 1 '^llama_1b +failed .*no loss line in the log' '^bench +failed .*no MFU figure' \
  '^attention +failed .*no log' '^== gpu-check: FAIL: gpu bench attention llama_1b; \(no GPU named\)'

# A training stage whose loss went NaN fails even though it printed tokens/s.
d=$(canned nanloss)
printf 'gpu_train: loss 10.3712 -> nan, nonfinite=3 of 6 steps\ngpu_train: 6 steps, cuda, bf16: tokens_per_s=51234.5\n' > "$d/llama_1b.log"
printf 'gpu_train: 6 steps, cuda, fp8: tokens_per_s=70123.4\n' > "$d/llama_1b_fp8.log"
expect "$d" 1 '^llama_1b +failed .*loss 10.3712 -> nan, nonfinite=3 of 6 steps' \
  '^llama_1b_fp8 +failed .*no loss line in the log' '^== gpu-check: FAIL: llama_1b llama_1b_fp8;'

# memcheck: errors found fail the stage with the count; a refused device is shown.
d=$(canned memerr "memcheck=failed (rc 3)")
printf '========= Invalid __global__ write of size 4 bytes\n========= ERROR SUMMARY: 2 errors\n' > "$d/memcheck.log"
expect "$d" 1 '^memcheck +failed .*ERROR SUMMARY: 2 errors' '^== gpu-check: FAIL: memcheck;'
d=$(canned memgone)
printf '========= Error: Device not supported\nmemcheck unavailable: compute-sanitizer refused this machine'"'"'s device (a gVisor runtime)\n' > "$d/memcheck.log"
expect "$d" 0 '^memcheck +ok .*memcheck unavailable: compute-sanitizer refused'

d=$WORK/empty
mkdir -p "$d"
out=$("$CHECK" summary "$d" 2>&1)
rc=$?
[ "$rc" -eq 2 ] && grep -q 'stages.tsv does not exist' <<<"$out" ||
  fail "summary of a directory without stages.tsv: exit $rc: $out"

# -- The stage runner and its budget ------------------------------------------------------
# (24 s of waiting on stages: tools/mutate, which needs one failure, stops before it.)
if [ -n "${TETRA_TEST_STOP_AT_FAILURE:-}" ] && [ "$fails" -gt 0 ]; then exit 1; fi
(
  # shellcheck source=../../tools/gpu-check
  source "$CHECK"
  OUT=$WORK/budget
  mkdir -p "$OUT"
  stage_quick() { echo "quick $*"; }
  stage_exit3() { return 3; }
  stage_sleepy() { trap '' TERM; sleep 60; }
  stage_stubborn() { trap '' TERM; sleep 60; }
  stage_late() { echo late; }
  export -f stage_quick stage_exit3 stage_sleepy stage_stubborn stage_late
  DEADLINE=$((SECONDS + 24))
  start=$SECONDS
  stage quick 100 a b; echo "quick=$?"
  stage exit3 100; echo "exit3=$?"
  stage stubborn 5; echo "stubborn=$?"
  stage sleepy 100; echo "sleepy=$?"
  stage late 100; echo "late=$?"
  echo "elapsed=$((SECONDS - start))"
) > "$WORK/budget.out" 2>&1
b=$WORK/budget
grep -q '^quick=0$' "$WORK/budget.out" && grep -q '^quick a b$' "$b/quick.log" || fail "a passing stage: $(cat "$WORK/budget.out")"
grep -q '^exit3=1$' "$WORK/budget.out" && grep -qP '^exit3\tfailed \(rc 3\)\t' "$b/stages.tsv" || fail "a failing stage: $(cat "$b/stages.tsv")"
# (10 s: killed 5 s after its 5 s cap; 9 to 13 where a loaded machine starts it late.)
grep -qP '^stubborn\ttimeout\t(9|1[0-3])\t5$' "$b/stages.tsv" || fail "a stage ignoring SIGTERM past its cap: $(cat "$b/stages.tsv")"
# stubborn is killed 5 s after its 5 s cap; sleepy, as stubborn, then gets 24 - 10 - 5 = 9 s
# (not 100; 5 to 9 s when a loaded machine starts processes late) and is killed 5 s later,
# at the deadline. (A 20 s budget left sleepy exactly 5 s, and one second of start-up lag
# under CI's load made it not-run.)
grep -qP '^sleepy\ttimeout\t' "$b/stages.tsv" || fail "a stage at the deadline: $(cat "$b/stages.tsv")"
grep -qP '^late\tnot-run\t0\t100$' "$b/stages.tsv" && grep -q '^late=1$' "$WORK/budget.out" ||
  fail "a stage after the deadline must be not-run: $(cat "$b/stages.tsv")"
elapsed=$(sed -n 's/^elapsed=//p' "$WORK/budget.out")
# 2 s of slack for starting processes on a busy machine; without timeout's kill grace in
# the budget the run would end at 29 s.
[ -n "$elapsed" ] && [ "$elapsed" -le 26 ] || fail "the stages ran ${elapsed:-?} s on a 24 s budget"

# The default budget ends the whole run inside one 600 s device call with a minute to
# spare, and the stages' caps (on the `stage NAME CAP` lines of a full run) add up to no
# more than it: otherwise the last stages are "not run" even when every stage keeps to
# its cap.
budget=$(bash -c 'source "$1"; echo "$BUDGET_S"' _ "$CHECK")
[ "$budget" -le 540 ] || fail "default budget $budget s: the run must end inside a 600 s call"
caps=$(grep -oE '(^ *|&& )stage [a-z_0-9]+ [0-9]+' "$CHECK" | awk '{ s += $NF } END { print s }')
nstages=$(grep -oE '(^ *|&& )stage [a-z_0-9]+ [0-9]+' "$CHECK" | wc -l)
[ -n "$caps" ] && [ "$nstages" -ge 10 ] || fail "could not read the stages' caps from $CHECK ($nstages stages)"
[ -z "$caps" ] || [ "$caps" -le "$budget" ] ||
  fail "the stages' caps add up to $caps s, over the $budget s budget: the last stages would not run"

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "PASS: gpu-check summaries of 10 canned runs, the stage budget and the caps"
