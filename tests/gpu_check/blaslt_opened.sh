#!/usr/bin/env bash
# cuBLASLt is opened on first use, not linked (kernels/kernel_cuda.h): linked, its 540 MB
# cost every tetra process about 25,000 page faults (0.12 s of system time) at start, a GPU
# in use or not. Without a GPU this checks that the binary does not name the library, that
# tt_blaslt_loaded opens it and finds every entry point the engine calls, and that where
# the library cannot be opened (the file hidden, in a mount namespace of its own) it says
# which file, why, and what to do, with 0 rather than a crash.
#   blaslt_opened.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: blaslt_opened.sh BUILD_DIR}
tetra="$build/tetra"
fail=0
probe='local ffi = require("ffi"); local tffi = require("tetra.ffi")
tffi.cdef_header("tetra_cuda.h")
local ok = tffi.C.tt_blaslt_loaded()
print("loaded " .. ok .. " " .. (ok == 0 and ffi.string(tffi.C.tt_last_error()) or ""))'

needed=$(readelf -d "$tetra" | grep -E 'NEEDED.*libcublas') &&
  { echo "FAIL: $tetra still links cuBLAS: $needed"; fail=1; }

out=$("$tetra" -e "$probe" 2>&1)
echo "here: $out"
[ "$out" = "loaded 1 " ] || { echo "FAIL: cuBLASLt did not open with every entry point"; fail=1; }

# The library as the loader finds it (ld.so.cache, else the toolkit's), hidden behind
# /dev/null.
lib=$(ldconfig -p | sed -nE 's/.*libcublasLt\.so\.[0-9]+ .*=> (.*)/\1/p' | head -n 1)
[ -n "$lib" ] || lib=$(ls /usr/local/cuda/lib64/libcublasLt.so.[0-9]* 2>/dev/null | head -n 1)
if [ -z "$lib" ]; then
  echo "FAIL: no libcublasLt.so.N found through ldconfig or in /usr/local/cuda/lib64"; fail=1
elif [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: hiding $lib needs root (unshare -m)"; exit 77
else
  real=$(readlink -f "$lib")
  out=$(unshare -m bash -c 'mount --bind /dev/null "$1" && "$2" -e "$3"' _ "$real" "$tetra" "$probe" 2>&1)
  echo "hidden: $out"
  if ! grep -qE '^loaded 0 cuBLASLt: cannot open libcublasLt\.so\.[0-9]+ .*LD_LIBRARY_PATH' <<<"$out"; then
    echo "FAIL: with $real hidden, tt_blaslt_loaded did not say which file, why and the fix"
    fail=1
  fi
fi
[ "$fail" = 0 ] && echo PASS
exit "$fail"
