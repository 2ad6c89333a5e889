#!/usr/bin/env bash
# tests/gpu_check/configure.sh — the CMake options tools/gpu-check relies on fail loudly:
# TETRA_REQUIRE_CUDA=ON without a CUDA compiler stops configure with one message (here
# the backend is turned off, which CMake must treat as missing); a TETRA_CUDA_ARCHS
# entry that is not an architecture stops it too; TETRA_CUDA_ARCHS=90a configures
# kernels for sm_90a alone (where nvcc exists); TETRA_REQUIRE_CUDA=ON without cuDNN's
# headers stops configure unless TETRA_REQUIRE_CUDNN=OFF.
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fails=0

out=$(cmake -S "$SRC" -B "$WORK/a" -DTETRA_CUDA=OFF -DTETRA_REQUIRE_CUDA=ON 2>&1)
rc=$?
if [ "$rc" -eq 0 ] || ! grep -q 'TETRA_REQUIRE_CUDA=ON but no CUDA compiler was found' <<<"$out"; then
  echo "FAIL: TETRA_REQUIRE_CUDA=ON without CUDA configured (rc $rc):"; echo "$out" | tail -5
  fails=$((fails + 1))
fi

if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc > /dev/null; then
  out=$(cmake -S "$SRC" -B "$WORK/b" -DTETRA_CUDA_ARCHS="sm90" 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ] || ! grep -q '"sm90" is not an architecture' <<<"$out"; then
    echo "FAIL: TETRA_CUDA_ARCHS=sm90 configured (rc $rc):"; echo "$out" | tail -5
    fails=$((fails + 1))
  fi
  out=$(cmake -S "$SRC" -B "$WORK/c" -DTETRA_CUDA_ARCHS=90a -DTETRA_REQUIRE_CUDA=ON 2>&1)
  rc=$?
  flags=$(grep -rhoE -- '-gencode=[^ ;"]+' "$WORK/c/CMakeFiles/tetra_cuda.dir/" 2>/dev/null | sort -u | paste -sd ' ')
  if [ "$rc" -ne 0 ] || [ "$flags" != "-gencode=arch=compute_90a,code=sm_90a" ]; then
    echo "FAIL: TETRA_CUDA_ARCHS=90a (rc $rc) compiles with: ${flags:-nothing}"; echo "$out" | tail -5
    fails=$((fails + 1))
  fi
  # No cuDNN headers to be found (every search re-rooted under an empty folder): refused
  # under TETRA_REQUIRE_CUDA, built with a warning when TETRA_REQUIRE_CUDNN=OFF.
  nocudnn=(-DTETRA_CUDA_ARCHS=90a -DTETRA_REQUIRE_CUDA=ON -DCMAKE_FIND_ROOT_PATH="$WORK/empty"
           -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY)
  mkdir -p "$WORK/empty"
  out=$(env -u CUDNN_PATH cmake -S "$SRC" -B "$WORK/d" "${nocudnn[@]}" 2>&1 | tr -s ' \n' ' ')
  rc=$?   # pipefail: cmake's status
  if [ "$rc" -eq 0 ] || ! grep -q 'no cuDNN headers (cudnn_graph.h) were found' <<<"$out"; then
    echo "FAIL: TETRA_REQUIRE_CUDA=ON without cuDNN headers configured (rc $rc):"; echo "${out: -400}"
    fails=$((fails + 1))
  fi
  out=$(env -u CUDNN_PATH cmake -S "$SRC" -B "$WORK/e" "${nocudnn[@]}" -DTETRA_REQUIRE_CUDNN=OFF 2>&1 |
        tr -s ' \n' ' ')
  rc=$?   # pipefail: cmake's status
  if [ "$rc" -ne 0 ] || ! grep -q 'no cuDNN headers (cudnn_graph.h) found' <<<"$out"; then
    echo "FAIL: TETRA_REQUIRE_CUDNN=OFF without cuDNN headers (rc $rc), no warning:"; echo "${out: -400}"
    fails=$((fails + 1))
  fi
else
  echo "SKIP: no nvcc: TETRA_CUDA_ARCHS not checked"
  exit 77
fi
[ "$fails" -eq 0 ] || exit 1
echo "PASS: TETRA_REQUIRE_CUDA, TETRA_REQUIRE_CUDNN and TETRA_CUDA_ARCHS"
