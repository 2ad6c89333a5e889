#!/usr/bin/env bash
# engine/obs/nvml.c without a GPU: with no libnvidia-ml.so.1 the endpoint's text has no
# DCGM_FI_* series and nothing fails; with a library of the test's own that answers
# like NVML (tests/cli/fake_nvml.c), every figure appears under its dcgm-exporter name
# with the right unit conversion, the device found through CUDA_VISIBLE_DEVICES (an
# index or a UUID), and an XID event counted once. The real NVML is not exercised here.
# Usage: bash nvml.sh /path/to/tetra
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
fail() { echo "FAIL: $*"; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cc="${CC:-cc}"
command -v "$cc" >/dev/null || fail "no C compiler"
"$cc" -shared -fPIC -O1 -Wall -Werror -o "$tmp/libnvidia-ml.so.1" "$root/tests/cli/fake_nvml.c" \
  || fail "cannot build the fake NVML"

# The store for GPU ordinal 1, formatted twice (the XID event must be counted once).
text() {   # LD_LIBRARY_PATH and CUDA_VISIBLE_DEVICES come from the caller
  "$tetra" -e '
    local C = require("ffi").C
    local tel = require("tetra.obs.telemetry")
    C.tt_telemetry_configure("nv", 0, 0, 0, 0, 0, 0, 1)
    tel.text()
    io.write(tel.text())'
}

out="$(unset LD_LIBRARY_PATH; text)" || fail "no NVML: the format failed"
echo "$out" | grep -q '^tetra_step{' || fail "no NVML: no tetra_step"
if ! ldconfig -p | grep -q libnvidia-ml.so.1; then
  echo "$out" | grep -q DCGM_ && fail "no NVML, yet DCGM series"
fi

check() {   # label, expected lines (grep -x) ...
  local what="$1"; shift
  for want in "$@"; do
    echo "$out" | grep -qxF -- "$want" || fail "$what: no line '$want' in: $(echo "$out" | grep DCGM_ | head -3)"
  done
}
L='job="nv",rank="0",dp="0",tp="0",pp="0",cp="0",gpu="1",modelName="Fake _H200_"'

# CUDA_VISIBLE_DEVICES=4,6: CUDA ordinal 1 is NVML device 6.
out="$(LD_LIBRARY_PATH="$tmp" CUDA_VISIBLE_DEVICES=4,6 text)" || fail "fake NVML: the format failed"
check "index" "DCGM_FI_DEV_GPU_TEMP{$L} 66" "DCGM_FI_DEV_FB_USED{$L} 7168" \
  "DCGM_FI_DEV_FB_TOTAL{$L} 147456" "DCGM_FI_DEV_FB_FREE{$L} 140288" \
  "DCGM_FI_DEV_GPU_UTIL{$L} 96" "DCGM_FI_DEV_MEM_COPY_UTIL{$L} 40" \
  "DCGM_FI_DEV_POWER_USAGE{$L} 250.506" "DCGM_FI_DEV_SM_CLOCK{$L} 1980" \
  "DCGM_FI_DEV_XID_ERRORS{$L} 79" "tetra_gpu_xid_errors_total{$L} 1" \
  "# TYPE DCGM_FI_DEV_GPU_TEMP gauge"
# By UUID: GPU-6 is device 6 too. Without CUDA_VISIBLE_DEVICES: ordinal 1 is device 1.
out="$(LD_LIBRARY_PATH="$tmp" CUDA_VISIBLE_DEVICES=GPU-0,GPU-6 text)" || fail "uuid: format failed"
check "uuid" "DCGM_FI_DEV_GPU_TEMP{$L} 66"
out="$(unset CUDA_VISIBLE_DEVICES; LD_LIBRARY_PATH="$tmp" text)" || fail "plain: format failed"
check "plain" "DCGM_FI_DEV_GPU_TEMP{$L} 61"
# A device CUDA_VISIBLE_DEVICES does not have: no GPU series, no failure.
out="$(LD_LIBRARY_PATH="$tmp" CUDA_VISIBLE_DEVICES=4 text)" || fail "missing device: format failed"
echo "$out" | grep -q DCGM_ && fail "DCGM series for a device that is not visible"
echo "nvml ok"
