#!/usr/bin/env bash
# The engine's f32 GEMM shapes on OpenBLAS (what tetra links), BLIS and oneDNN, side by
# side in one run (tools/bench/gemm_backends.c says which shapes and how they are timed):
# GFLOP/s per backend and shape, the fastest named, each result checked against OpenBLAS
# and against its own repeat (bit for bit); and oneDNN's bf16 GEMM on the same shapes
# (TETRA_BF16_GEMM=dot) against the fastest f32 library. Installs libblis-dev and libdnnl-dev (Debian's
# BLIS 0.9 and oneDNN 2.6) when they are missing; they are for this benchmark only.
#
#   tools/bench/gemm_backends.sh [--threads 1,2] [--rounds 3]
#
# OPENBLAS_CORETYPE: as tetra chooses it (the cpuid rule of engine/common/cpu.c), unless
# set; the line naming OpenBLAS's core says which it took. OMP_WAIT_POLICY passive on all
# three, as tetra runs.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
threads=1,2 rounds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "gemm_backends.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
need=()
for pkg in libopenblas-dev libblis-dev libdnnl-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "# installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null
fi
bin="$(mktemp -d)/gemm_backends"
trap 'rm -rf "$(dirname "$bin")"' EXIT
gcc -O2 -Wall -Wextra -fopenmp "$root/tools/bench/gemm_backends.c" -o "$bin" -ldl -lm
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -x "$root/build/tetra" ]; then
  core=$("$root/build/tetra" --version 2>/dev/null | sed -nE 's/.*OpenBLAS core ([A-Za-z0-9]+).*/\1/p' | head -n 1)
  [ -n "$core" ] && export OPENBLAS_CORETYPE="$core"
fi
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
echo "# cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(nproc) cores online, load $(cut -d' ' -f1-3 /proc/loadavg)"
status=0
for t in ${threads//,/ }; do
  "$bin" "$t" "$rounds" || status=1
  echo
done
exit $status
