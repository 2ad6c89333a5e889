#!/usr/bin/env bash
# cuBLASLt is opened on first use, not linked (kernels/kernel_cuda.h): linked, its 540 MB
# cost every tetra process about 25,000 page faults (0.12 s of system time) at start, a GPU
# in use or not. Without a GPU this checks that a started tetra has not mapped the library
# (nor does the binary name it), that tt_blaslt_loaded opens it and finds every entry point
# the engine calls, and that where that very file cannot be opened (hidden, in a mount
# namespace of its own) it says which file, why, and what to do, with 0 rather than a crash.
# Then a split pip layout (PyTorch's CUDA wheels): libcudart from nvidia/cuda_runtime/lib
# on LD_LIBRARY_PATH, cuBLASLt only in the sibling wheel nvidia/cublas/lib, the loader's
# copy hidden: it is opened from the wheel.
#   blaslt_opened.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: blaslt_opened.sh BUILD_DIR}
tetra="$build/tetra"
fail=0
# Prints "before PATH|none", "loaded 1|0 [message]" and "after PATH|none": the library
# mapped into this process before the call and after it (/proc/self/maps); then
# "cudart PATH|none", the libcudart mapped (the file, its links resolved).
probe='local ffi = require("ffi"); local tffi = require("tetra.ffi")
local function mapped()
  local f = io.open("/proc/self/maps"); local s = f:read("*a"); f:close()
  return s:match("(/%S*libcublasLt%.so[%.%d]*)") or "none"
end
tffi.cdef_header("tetra_cuda.h")
print("before " .. mapped())
local ok = tffi.C.tt_blaslt_loaded()
print("loaded " .. ok .. (ok == 0 and " " .. ffi.string(tffi.C.tt_last_error()) or ""))
print("after " .. mapped())
local f = io.open("/proc/self/maps"); local s = f:read("*a"); f:close()
print("cudart " .. (s:match("(/%S*libcudart%.so[%.%d]*)") or "none"))'

command -v readelf > /dev/null || { echo "FAIL: no readelf (binutils)"; exit 1; }
needed=$(readelf -d "$tetra" | grep -E 'NEEDED.*libcublas') &&
  { echo "FAIL: $tetra still links cuBLAS: $needed"; fail=1; }

out=$("$tetra" -e "$probe" 2>"$build/blaslt_opened.err")
out0=$out
echo "$out" | sed 's/^/here: /'
grep -qx 'before none' <<<"$out" || { echo "FAIL: cuBLASLt was mapped before any call"; fail=1; }
grep -qx 'loaded 1' <<<"$out" ||
  { echo "FAIL: cuBLASLt did not open with every entry point"; cat "$build/blaslt_opened.err"; fail=1; }
lib=$(sed -n 's/^after //p' <<<"$out")
if [ -z "$lib" ] || [ "$lib" = none ]; then
  echo "FAIL: no libcublasLt mapped after tt_blaslt_loaded"; exit 1
fi

# The very file the process opened, hidden behind /dev/null.
if [ "$(id -u)" -ne 0 ] || ! unshare -m true 2>/dev/null; then
  echo "SKIP: hiding $lib needs root and mount namespaces (unshare -m)"
  exit $((fail ? 1 : 77))
fi
real=$(readlink -f "$lib")
out=$(unshare -m bash -c 'mount --bind /dev/null "$1" || exit 3; "$2" -e "$3"' _ "$real" \
        "$tetra" "$probe" 2>&1)
rc=$?
echo "$out" | sed 's/^/hidden: /'
if [ "$rc" -eq 3 ]; then
  echo "FAIL: could not hide $real (mount --bind)"; fail=1
elif ! grep -qE '^loaded 0 cuBLASLt: cannot open libcublasLt\.so\.[0-9]+ .*LD_LIBRARY_PATH' <<<"$out"; then
  echo "FAIL: with $real hidden, tt_blaslt_loaded did not say which file, why and the fix"
  fail=1
fi

# The split pip layout. The wheel's cuBLASLt is the real file bound there (the bind is made
# before the original is hidden); its libcudart, a link to the real one, named as the soname
# the binary needs.
cudart=$(sed -n 's/^cudart //p' <<<"$out0")
soname=$(readelf -d "$tetra" | sed -n 's/.*NEEDED.*\[\(libcudart\.so\.[0-9]*\)\].*/\1/p')
if [ -z "$soname" ] || [ -z "$cudart" ] || [ "$cudart" = none ]; then
  echo "FAIL: no libcudart linked ($soname) or mapped ($cudart)"; exit 1
fi
wheel="$(cd "$build" && pwd -P)/blaslt_opened.wheel"   # (maps shows paths resolved)
rm -rf "$wheel"
mkdir -p "$wheel/nvidia/cuda_runtime/lib" "$wheel/nvidia/cublas/lib"
ln -s "$cudart" "$wheel/nvidia/cuda_runtime/lib/$soname"
# Named by its soname, as a wheel names it (a toolkit's file is libcublasLt.so.13.0.x).
blaslt_soname=$(readelf -d "$real" | sed -n 's/.*SONAME.*\[\(.*\)\].*/\1/p')
[ -n "$blaslt_soname" ] || { echo "FAIL: $real names no soname"; exit 1; }
in_wheel="$wheel/nvidia/cublas/lib/$blaslt_soname"
: >"$in_wheel"
out=$(unshare -m bash -c 'mount --bind "$1" "$2" && mount --bind /dev/null "$1" || exit 3
        LD_LIBRARY_PATH="$3" "$4" -e "$5"' _ "$real" "$in_wheel" \
        "$wheel/nvidia/cuda_runtime/lib" "$tetra" "$probe" 2>&1)
rc=$?
echo "$out" | sed 's/^/wheel: /'
if [ "$rc" -eq 3 ]; then
  echo "FAIL: could not bind $real into the wheel and hide it (mount --bind)"; fail=1
elif ! grep -qx 'loaded 1' <<<"$out" || ! grep -qxF "after $in_wheel" <<<"$out"; then
  echo "FAIL: with libcudart from a wheel and cuBLASLt only in the nvidia-cublas wheel beside" \
       "it, cuBLASLt was not opened from there ($in_wheel)"
  fail=1
fi
rm -rf "$wheel"
[ "$fail" = 0 ] && echo PASS
exit "$fail"
